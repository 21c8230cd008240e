"""Shared request preparation: the one place a request becomes generation options.

The CLI's in-process path and the server's workers call exactly this code.
"""
