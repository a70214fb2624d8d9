"""Helpers with no envkit dependency: a background event loop for sync callers (:mod:`envkit.util.background`), YAML
options files for argparse parsers (:mod:`envkit.util.options`), ending a multi-process run
(:mod:`envkit.util.process_exit`), the one owner of every process envkit starts (:mod:`envkit.util.children`),
how this envkit was installed, for the command that adds an extra (:mod:`envkit.util.install`), and an error
quoted on one line (:mod:`envkit.util.text`)."""
