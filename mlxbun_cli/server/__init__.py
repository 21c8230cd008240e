"""The ASGI server: routes, the model it serves, the daemon's own process."""
