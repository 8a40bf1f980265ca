"""Every workaround of an upstream project's bug or cost, in one place: what it works around, the version it was
checked against, where it lives, and its canary (a test that fails when upstream fixes it, so the workaround can go).

Someone upgrading transformers, onnxscript, OpenVINO or ExecuTorch reads `WORKAROUNDS`, runs each entry's canary
and the tests beside it, and removes what upstream fixed. A format's fixes live in its package
(`formats.executorch.workarounds`, `formats.onnx.onnxscript_workarounds`, `formats.onnx.onnxruntime_workarounds`,
`formats.openvino.workarounds`), the model code's in `workarounds.transformers_models`; the
engine internals hfexport reads (transformers.exporters names that are not its public API) are listed in
`workarounds.transformers_exporters.INTERNALS` and reached through `hfexport.engine`. This module is data only: it
imports none of them (tests/test_workarounds.py checks every entry's module and canary exist).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Workaround:
    name: str
    upstream: str  # the project and the version it was checked against
    works_around: str
    module: str  # where it lives, under hfexport
    applied: str  # where hfexport applies it
    canary: str  # pytest node id: fails once upstream no longer has the problem


WORKAROUNDS = (
    Workaround(
        name="executorch-split-dtype-validator",
        upstream="executorch 1.5.1",
        works_around="to_edge's EdgeOpArgValidator iterates a Tensor[] return as its first tensor, so len() adds a "
                     "guard that specializes a split's dynamic batch (any other batch then fails at run time)",
        module="formats.executorch.workarounds", applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
        canary="tests/test_executorch_fixes.py::test_without_the_fix_executorch_still_specializes_the_batch"),
    Workaround(
        name="executorch-xnnpack-retraces",
        upstream="executorch 1.5.1",
        works_around="(cost) XNNPACK's preprocess retraces each partition after passes that left it unchanged, "
                     "to_edge decomposes a second time with nothing left, pattern passes build patterns no partition "
                     "can match; the programs stay byte for byte the same",
        module="formats.executorch.workarounds", applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
        canary="tests/test_executorch_fixes.py::test_the_cost_fixes_leave_the_program_byte_identical"),
    Workaround(
        name="onnxscript-multi-output-matcher",
        upstream="onnxscript 0.7.2",
        works_around="(cost) SimplePatternMatcher indexes the whole graph for every node before checking its op, "
                     "so the optimizer's rewrite pass is quadratic in the graph's size",
        module="formats.onnx.onnxscript_workarounds", applied="export._format_fixes, around every ONNX export (onnx_fixes)",
        canary="tests/test_onnx_fixes.py::test_the_fix_keeps_the_optimized_graph_and_drops_the_per_node_scans"),
    Workaround(
        name="onnxruntime-rms-norm-fusion",
        upstream="onnxruntime 1.32.0 (SimplifiedLayerNormFusion) with torch 2.13 (onnxscript 0.7.2 torchlib: rsqrt "
                 "is Reciprocal(Sqrt))",
        works_around="(cost) the exporter writes an RMSNorm as x * Reciprocal(Sqrt(v)), onnxruntime's fusion into "
                     "one SimplifiedLayerNormalization kernel matches x / Sqrt(v) only: every runtime built on it "
                     "(optimum, onnxruntime-genai, transformers.js on Node) ran the norms unfused",
        module="formats.onnx.onnxruntime_workarounds",
        applied="export.run_plan, on every ONNX program the engine exports (fuse_ready_rms_norms)",
        canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_leaves_the_rms_norm_unfused"),
    Workaround(
        name="onnxruntime-key-transpose-fusion",
        upstream="onnxruntime 1.32.0 (MatMulTransposeFusion) with torch 2.13 (onnxscript 0.7.2 torchlib: "
                 "scaled_dot_product_attention swaps the key's axes through a 3-d view)",
        works_around="(cost) torchlib transposes attention's key as Reshape, Transpose([0, 2, 1]), Reshape; "
                     "onnxruntime folds a transpose into the Q @ K^T matmul only when it feeds the matmul directly, "
                     "so every layer copied its key cache transposed on every step",
        module="formats.onnx.onnxruntime_workarounds",
        applied="export.run_plan, on every ONNX program the engine exports (fuse_ready_key_transposes)",
        canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_copies_the_key_transposed"),
    Workaround(
        name="onnxruntime-grouped-query-cache-copies",
        upstream="onnxruntime 1.32.0 (no graph optimization undoes a repeat) with transformers 5.23 (repeat_kv)",
        works_around="(cost) transformers' repeat_kv exports as Unsqueeze, Expand, Reshape: every layer copied its "
                     "whole key and value cache once per query head of a group, every step, before the two "
                     "attention matmuls; rewritten as the same matmuls broadcast over the group",
        module="formats.onnx.onnxruntime_workarounds",
        applied="export.run_plan, on every ONNX program the engine exports (broadcast_grouped_query_caches)",
        canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_copies_the_repeated_cache"),
    Workaround(
        name="openvino-returned-shared-input",
        upstream="openvino 2026.4.1 (CPU plugin)",
        works_around="a program that returns one of its inputs keeps the caller's shared input buffer bound and "
                     "writes through it once freed (heap corruption, SIGSEGV); such runners always copy their inputs",
        module="formats.openvino.workarounds",
        applied="exported.ExportedModel.to, where the runners are made: ExportedModel.__call__, runners[...] and "
                "generate are all covered",
        canary="tests/test_generate_seq2seq.py::test_openvino_corrupts_the_heap_through_a_returned_shared_input"),
    Workaround(
        name="openvino-fused-kv-cache-attention",
        upstream="transformers 5.23.0 (exporters: _use_numpy_broadcasts) with openvino 2026.4.1 (CPU plugin: "
                 "StatefulSDPAFusion)",
        works_around="(cost) the engine makes repeat_kv's bidirectional Broadcast numpy, which the CPU plugin's fused "
                     "KV-cache attention does not match: a grouped-query stateful decode ran every attention unfused "
                     "(optimum-intel's runtime, GenAI's SDPA backend, hfexport's generate); put back between the "
                     "cache and the SDPA only",
        module="formats.openvino.workarounds",
        applied="export.run_plan, on every OpenVINO program the engine exports (fuse_ready_cache_broadcasts)",
        canary="tests/test_deployment_llm.py::test_the_engines_own_stateful_decode_compiles_to_unfused_attention"),
    Workaround(
        name="transformers-mamba-scan",
        upstream="transformers 5.23.0 (models/mamba)",
        works_around="without CUDA kernels Mamba's selective scan is a Python loop that torch.export unrolls, "
                     "specializing the sequence length; run as torch's scan on dynamo and ONNX",
        module="workarounds.transformers_models",
        applied="export._format_fixes around torch.export and ONNX exports of Mamba (modeling_fixes); plan.state_space "
                "reads prefill_by_decode where it cannot apply",
        canary="tests/test_modeling_fixes.py::test_without_the_fix_the_export_specializes_the_sequence"),
    Workaround(
        name="transformers-rope-index-on-base-model",
        upstream="transformers 5.23.0 (exporters.utils.precompute_export_inputs)",
        works_around="the engine runs the LLM rope index (`get_rope_index`) only when the traced module has it; a "
                     "Qwen2-VL-class *ForConditionalGeneration keeps it on its base model, so a whole-model forward "
                     "traced without positions stops in the rope index's tolist()",
        module="workarounds.transformers_models",
        applied="plan.tracing._prepared (the plan's shapes, probes, the report's prepared_inputs) and export.run_plan "
                "(the forward export's inputs)",
        canary="tests/test_preparer_families.py::test_the_engine_alone_computes_no_rope_index_for_the_outer_model"),
    Workaround(
        name="transformers-sliding-window-trace",
        upstream="transformers 5.23.0 (exporters; huggingface/transformers#49542)",
        works_around="the dynamo exporter traces sliding-window cache layers as full DynamicLayers while eager cuts "
                     "them to the window, so the engine's eager capture traced a decode the prefill cannot feed",
        module="engine", applied="engine.traced_cache_layout around the generation capture and the probes",
        canary="tests/test_sliding_window.py::test_eager_cuts_the_sliding_layer_to_its_window"),
    Workaround(
        name="transformers-exporters-internals",
        upstream="transformers 5.23.0 (exporters)",
        works_around="names hfexport needs that are not the engine's public API (backend table, runner classes, "
                     "feeds, treespec registry, ...), each listed with the version it was checked against",
        module="workarounds.transformers_exporters", applied="read through hfexport.engine only",
        canary="tests/test_architecture.py::test_engine_internals_are_named_once_and_still_exist"),
)
