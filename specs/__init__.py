"""The bundled specs (package data): ``dlmspec new OUT --from NAME`` copies one by name."""
