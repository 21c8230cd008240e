"""The seam that lets every command run in process or against the daemon."""
