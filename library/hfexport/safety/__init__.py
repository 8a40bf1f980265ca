"""Loading a downloaded export never runs code and never reads outside its folder (docs/security.md).

- `artifacts`: the manifest, every file it names (inside the folder, bounded sizes), the bounded readers
- `treespec`: the pytree specs and class names a manifest or a `.pt2` may carry (an allowlist)

Each format's own files are checked in its package (`formats/<format>/file_check`, `formats/torch_export/pt2_safety`).
"""
