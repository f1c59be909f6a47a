"""技术地图 (tech-map) snippets: the taxonomy and glossary data, their schema, and renderers."""
