"""Loading a downloaded export never runs code and never reads outside its folder (docs/security.md).

- `artifacts`: the manifest, every file it names (inside the folder, bounded sizes) and each format's files
- `treespec`: the pytree specs and class names a manifest or a `.pt2` may carry (an allowlist)
- `pt2`: the `.pt2` archive (members, pickles, guard and sympy expressions)
"""
