"""The long-context evaluation suite: perplexity vs length (non-overlapping and sliding windows, per-position
loss), passkey / needle / key-value retrieval by exact greedy decoding, training-free extension methods at
evaluation time, and the report (results.json, report.md, PNG figures, TensorBoard). docs/evaluation.md.

    from minilm.eval import evaluate_run
    results, out_dir = evaluate_run("runs/tiny", lengths=[128, 256, 512], extension={"name": "dynamic", "factor": 4})
"""

from minilm.eval.report import compare, load_results, log_tensorboard, write_report
from minilm.eval.suite import (
    TASKS,
    EvalData,
    EvalSettings,
    applied_extension,
    apply_extension,
    check_extension,
    extension_from_flag,
    default_lengths,
    eval_data,
    evaluate,
    evaluate_phase,
    evaluate_run,
    length_limit,
    parse_extension,
    resolve_device,
    validate_eval,
)

__all__ = [
    "TASKS",
    "EvalData",
    "EvalSettings",
    "applied_extension",
    "apply_extension",
    "check_extension",
    "extension_from_flag",
    "compare",
    "default_lengths",
    "eval_data",
    "evaluate",
    "evaluate_phase",
    "evaluate_run",
    "length_limit",
    "load_results",
    "log_tensorboard",
    "parse_extension",
    "resolve_device",
    "validate_eval",
    "write_report",
]
