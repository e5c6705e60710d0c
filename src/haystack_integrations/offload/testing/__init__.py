"""Tools for testing and benchmarking against local stand-ins of real infrastructure (not imported by the library)."""
