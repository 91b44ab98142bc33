"""The `farctx` command line."""
