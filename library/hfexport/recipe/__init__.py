"""Recipes: the owner's `export_config.json`.

- `validation`: parse (strict JSON) and validate against the schema and the semantic rules, every problem with
  its JSON path
- `model`: `Recipe` and `Target`
- `loading`: from a file, a folder (`export_config.json` or `config.json`'s `export_config`), the Hub, or a dict
"""
