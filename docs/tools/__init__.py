"""Tools that build the docs: diagrams from text, the API reference pages (mkdocs hooks)."""
