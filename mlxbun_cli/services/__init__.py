"""Services the commands call: they do the work and return results."""
