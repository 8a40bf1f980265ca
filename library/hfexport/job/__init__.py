"""Jobs: one model revision, one or more recipe targets, the API every surface runs.

- `run`: `run_job` (load once, then each target through its pipeline)
- `pipeline`: `TargetPipeline`, one target's stages: plan, produce (export or rebind), save, gate, report
- `compare`: quantized targets against their unquantized reference
- `reverify`: verification of a saved export without exporting again
- `preflight`: memory and disk estimates before anything loads
- `init`: a proposed recipe for a model without one, checked by a job
"""
