"""One token judge for every deployment runtime (`deployment._python.judge`): the ONNX runtimes' answers
(`batch1`/`padded`) and the OpenVINO ones' (`f32`/`f32_padded`, the stop token they drop kept) go through it."""

from hfexport.deployment import FAILED, PASSED, GenerationRequest
from hfexport.deployment._python import judge
from hfexport.formats.openvino.runtimes.openvino_genai import judge_f32


def _request(padded=True):
    return GenerationRequest([[1, 2], [3]], [[4, 9], [5, 6, 7]], 3, [9], pad_token_id=0,
                             padded_expected=[[4, 9], [5, 6, 8]] if padded else None)


def test_batch_one_then_the_padded_batch_token_for_token():
    request = _request()
    check = judge("r", request, {"version": "1", "batch1": [[4, 9, 3], [5, 6, 7, 1]], "padded": [[4, 9], [5, 6, 8]]},
                  [1, 2])
    assert check.verdict == PASSED and check.version == "1" and check.batch_sizes == [1, 2]
    wrong = judge("r", request, {"batch1": [[4, 9], [5, 6, 7]], "padded": [[4, 9], [5, 6, 7]]}, [1, 2])
    assert wrong.verdict == FAILED and wrong.reason.startswith("left-padded batch of 2: prompt 1 differs at new token 2")
    missing = judge("r", request, {"batch1": [[4, 9], [5, 6, 7]]}, [1, 2])
    assert missing.verdict == FAILED  # asked for the padded batch, got none: not a pass
    first = judge("r", request, {"batch1": [[4, 8], [5, 6, 7]], "padded": [[4, 9], [5, 6, 8]]}, [1, 2])
    assert first.verdict == FAILED and first.first_difference == {**first.first_difference, "prompt": 0, "position": 1}
    assert judge("r", _request(padded=False), {"batch1": [[4, 9], [5, 6, 7]]}, [1]).verdict == PASSED


def test_a_dropped_stop_token_is_kept_only_where_asked():
    request = _request()
    answer = {"f32": [[4], [5, 6, 7]], "f32_padded": [[4], [5, 6, 8]], "version": "2026.4.1"}
    check = judge_f32("openvino-genai", request, answer, [1, 2])
    assert check.verdict == PASSED and check.precision == "f32" and check.version == "2026.4.1"
    onnx_like = judge("r", request, {"batch1": answer["f32"], "padded": answer["f32_padded"]}, [1, 2])
    assert onnx_like.verdict == FAILED  # the ONNX runtimes return their stop token: a missing one is a difference
