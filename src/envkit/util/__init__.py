"""Helpers with no envkit dependency: a background event loop for sync callers (:mod:`envkit.util.background`) and
YAML options files for argparse parsers (:mod:`envkit.util.options`)."""
