"""Test helpers for hfexport: a local Hub-compatible server (`hfexport.testing.hub`) and model factories.

Kept import-free on purpose: submodules are imported explicitly, so importing `hfexport.testing` never pulls in
torch, transformers or huggingface_hub.
"""
