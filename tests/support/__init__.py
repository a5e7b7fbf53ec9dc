"""Helpers shared by the tests: the docs-command machinery (docs_commands), ..."""
