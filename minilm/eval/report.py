"""What an evaluation leaves behind: ``results.json``, ``report.md``, PNG figures, TensorBoard scalars and images.

``results.json`` (keys of per-length mappings are the lengths as strings; ``null`` = not measured there)::

    run, name (run.name), phase, step (global), phase_step (a step checkpoint's, in its phase), label (name/phase...:
    titles the report and every figure), weights, started_from (the weights the phase started from, as its
    complete.json or step checkpoint records them: minilm.runs.started_from_text), extension,
    position, train_seq_len, vocab_size, lengths, depths, tasks, samples
    seed, batches, batch_tokens, sliding, stride, needles   (the settings; absent from files of older versions)
    tokenizer_sha256, val_sha256   (the tokenizer file and the held-out documents measured; absent from older files)
    ppl            {L: perplexity, non-overlapping windows}      loss  {L: mean nats/token, same windows}
    ppl_sliding    {L: perplexity, sliding windows}
    per_position_loss {L: {positions: [...], loss: [...]}}       (bucketed to at most 128 points)
    passkey        {L: exact-match accuracy over all depths}     passkey_grid {L: {depth: accuracy}}
    needle         {L: accuracy}                                 needle_grid  {L: {depth: accuracy}}
    kv             {L: accuracy}
    details        {task: {L: {...}}}   token accuracy, answer log-prob, tokens / samples counted
    unsupported    {L: why}             lengths beyond the encoding's limit (a ``learned`` table) — not run
    skipped        {task: {L: why}}     a task that could not run at a length (no data long enough, OOM, ...)
    examples       {task: [{length, depth, answer, greedy}]}    one greedy continuation per length

Figures (Agg backend, written next to results.json): ``ppl_vs_length.png``, ``per_position_loss.png``,
``passkey_heatmap.png``, ``needle_heatmap.png``, ``retrieval_vs_length.png`` (each only when its data exists; a
re-run into the same folder removes those it does not draw). Every file is written whole, then moved in place.
TensorBoard: scalars ``eval/ppl@L``, ``eval/ppl_sliding@L``, ``eval/passkey@L``, ``eval/needle@L``, ``eval/kv@L``
and the figures as images ``eval/<figure>``, at the run's global step (with an extension the prefix is
``eval-<method>`` so runs with and without one do not overwrite each other's curves).
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from minilm.errors import MinilmError
from minilm.files import atomic_write, atomic_write_text, remove_stale_temporaries


class _Pyplot:
    """matplotlib.pyplot, imported on first use (Agg: files only, never a display), so that loading a config —
    which validates the eval section through this package — does not pay for matplotlib."""

    def __getattr__(self, name):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot

        return getattr(matplotlib.pyplot, name)


plt = _Pyplot()
import numpy as np  # noqa: E402

RETRIEVAL = ("passkey", "needle", "kv")
SCALARS = ("ppl", "ppl_sliding", "passkey", "needle", "kv")
# every figure an evaluation can draw, as <name>.png: a re-run into the same folder removes those it did not draw
FIGURES = ("ppl_vs_length", "per_position_loss", "passkey_heatmap", "needle_heatmap", "retrieval_vs_length")


# ------------------------------------------------------------------------------------------------------ helpers


def _lengths(results: dict, key: str) -> List[int]:
    return sorted(int(k) for k, v in results.get(key, {}).items() if v is not None)


def plural(n: int, noun: str) -> str:
    """``1 prompt``, ``5 prompts`` (regular nouns only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fmt(v, kind: str) -> str:
    if v is None:
        return "—"
    if kind == "ppl":
        return f"{v:.2f}" if v < 1e4 else f"{v:.3g}"
    return f"{v:.2f}"


def prompts(results: dict, task: str, L) -> Optional[int]:
    """How many prompts the accuracy of ``task`` at ``L`` is the mean of (``details[task][L].samples``), or None."""
    n = ((results.get("details") or {}).get(task) or {}).get(str(L), {}).get("samples")
    return int(n) if isinstance(n, (int, float)) and n > 0 else None


def wilson_interval(accuracy: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``accuracy`` measured on ``n`` prompts: unlike
    ± 1.96·√(p(1−p)/n) it is not [0, 0] for 0 of n (0 of 10 is still up to 0.28). Wilson 1927; Brown, Cai &
    DasGupta 2001."""
    k = round(accuracy * n)
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _acc_cell(results: dict, task: str, L) -> str:
    """An accuracy with its 95 % interval from the prompts it counts: ``0.40 [0.17, 0.69]``."""
    v = results.get(task, {}).get(str(L))
    n = prompts(results, task, L)
    if v is None or n is None:
        return _fmt(v, "acc")
    lo, hi = wilson_interval(v, n)
    return f"{v:.2f} [{lo:.2f}, {hi:.2f}]"


def _prompt_counts(results: dict, tasks) -> str:
    """``passkey 10, kv 10`` (one number when every length has it, else the range)."""
    parts = []
    for task in tasks:
        ns = sorted({n for L in results.get(task, {}) if (n := prompts(results, task, L)) is not None})
        if ns:
            parts.append(f"{task} {ns[0]}" if len(ns) == 1 else f"{task} {ns[0]}–{ns[-1]}")
    return ", ".join(parts)


def make_output_dir(out_dir: Path) -> None:
    """mkdir -p, or one message naming the directory (a file of that name, no permission, ...)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MinilmError(f"{out_dir}: cannot write the evaluation output there ({e.strerror}); choose another "
                          "output directory (--out)") from None  # fmt: skip


def write_json(results: dict, path: Path) -> None:
    make_output_dir(path.parent)
    atomic_write_text(path, json.dumps(results, indent=2, default=_json_default, allow_nan=False))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def load_results(path: Path) -> dict:
    """A ``results.json`` (or the directory holding it); MinilmError naming the file if it is not one."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise MinilmError(f"{path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise MinilmError(f"{path}: not a results.json of scripts/evaluate.py (invalid JSON at line {e.lineno}, "
                          f"column {e.colno}: {e.msg})") from None  # fmt: skip
    if not isinstance(results, dict):
        raise MinilmError(f"{path}: not a results.json of scripts/evaluate.py (a JSON object expected, got "
                          f"{type(results).__name__})")  # fmt: skip
    # what compare() and the report read: per-length mappings of numbers (or null), a list of lengths
    for key in (*SCALARS, "loss"):
        per = results.get(key, {})
        if not isinstance(per, dict) or not all((v is None or isinstance(v, (int, float))) and str(k).isdigit()
                                                for k, v in per.items()):  # fmt: skip
            raise MinilmError(f"{path}: not a results.json of scripts/evaluate.py ('{key}' must map lengths to "
                              f"numbers or null, got {json.dumps(per)[:80]})")  # fmt: skip
    if not isinstance(results.get("lengths", []), list) or not isinstance(results.get("unsupported", {}), dict):
        raise MinilmError(f"{path}: not a results.json of scripts/evaluate.py ('lengths' must be a list and "
                          "'unsupported' a mapping)")  # fmt: skip
    if not any(key in results for key in (*SCALARS, "loss")):  # {"foo": 1} gave an empty table and figure
        raise MinilmError(f"{path}: not a results.json of scripts/evaluate.py (none of {', '.join(SCALARS)})")
    return results


# ------------------------------------------------------------------------------------------------------ figures


def _title(results: dict, title: str) -> str:
    """``title`` and, below it, which run and phase (and extension) it shows — results' label: every figure of a
    study's runs was titled alike ('Per-position loss'), so two opened side by side could not be told apart — and
    the extension's parameters, which the label does not name (``+ rerope``): two figures of one method with other
    parameters (``--out``) were titled alike."""
    label = [results["label"]] if results.get("label") else []  # (a long label fits on a line of its own)
    return "\n".join([title, *label, *_extension_lines(results)])


FIGURE_LINE_CHARS = 60  # the extension's parameters in a figure's title are wrapped at this many characters


def _extension_lines(results: dict) -> list[str]:
    """The parameters of the extension an evaluation applied (results' ``extension`` as applied, filled-in values
    included), ``key=value, ...`` in lines of up to ``FIGURE_LINE_CHARS``; a list (longrope's factors) as its length."""
    ext = results.get("extension") or {}
    lines: list[str] = []
    for k, v in ext.items():
        if k == "name":
            continue
        item = f"{k}={f'[{len(v)} values]' if isinstance(v, list) else v}"
        if lines and len(lines[-1]) + 2 + len(item) <= FIGURE_LINE_CHARS:  # one parameter is never cut in two
            lines[-1] += f", {item}"
        else:
            lines.append(item)
    return lines


def _train_len_line(ax, n: int, shown: Sequence[float], ls: str = "--") -> None:
    """A line at the training length ``n``, drawn only where it falls within ``shown`` (the x values the panel
    plots): a training length past them (trained at 4096, evaluated at 128..2048) stretched the axis to it,
    crowding the curves into its left part."""
    if shown and min(shown) <= n <= max(shown):
        ax.axvline(n, color="grey", ls=ls, lw=1)


def _train_len_handle(n: int, shown: Sequence[float], label: str, ls: str = "--"):
    """The legend entry of _train_len_line, which says when the line is not drawn and why."""
    from matplotlib.lines import Line2D

    if shown and not min(shown) <= n <= max(shown):
        label += f"\n({'past' if n > max(shown) else 'below'} the lengths shown: no line)"
    return Line2D([], [], color="grey", ls=ls, lw=1, label=label)


def _mark_train_len(ax, results: dict, shown: Sequence[float]) -> list:
    """The training length's line (where it falls within ``shown``); its legend handle, in a list (none if the
    results do not say it)."""
    n = results.get("train_seq_len")
    if not n:
        return []
    _train_len_line(ax, n, shown)
    return [_train_len_handle(n, shown, f"train length {n}")]


def _legend(ax, extra: list, **kw) -> None:
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=extra + handles, **kw)


def _length_axis(ax, lengths) -> None:
    """Log2 x axis ticked at the evaluated lengths, written as numbers (64, not 2⁶; 96 gets a tick of its own)."""
    ax.set_xscale("log", base=2)
    if lengths:
        ax.set_xticks(sorted(set(lengths)), [str(L) for L in sorted(set(lengths))])
        ax.minorticks_off()


def _ppl_axis(ax) -> None:
    """Log y axis of perplexity, labelled with plain numbers (60, 1500, 2.5) on the ticks matplotlib labels: over
    less than a decade, as a trained model's curves usually are, it wrote 6×10¹ and 1.52×10³."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x, pos=None):
            return (f"{x:g}" if x < 1e4 else f"{x:,.0f}") if super().__call__(x, pos) else ""

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(Plain())
    ax.yaxis.set_minor_formatter(Plain(labelOnlyBase=False))
    ax.set_ylabel("perplexity")


def _ppl_figure(results: dict):
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label, style in (("ppl", "windows", "o-"), ("ppl_sliding", "sliding", "s--")):
        xs = _lengths(results, key)
        if xs:
            ax.plot(xs, [results[key][str(x)] for x in xs], style, label=label)
    shown = _lengths(results, "ppl") + _lengths(results, "ppl_sliding")
    train = _mark_train_len(ax, results, shown)
    _length_axis(ax, shown)
    _ppl_axis(ax)
    ax.set_xlabel("context length (tokens)")
    ax.set_title(_title(results, "Perplexity vs length"))
    ax.grid(alpha=0.3, which="both")
    _legend(ax, train)
    fig.tight_layout()
    return fig


def _position_figure(results: dict):
    curves = results.get("per_position_loss", {})
    fig, ax = plt.subplots(figsize=(6, 4))
    for L in sorted(int(k) for k in curves):
        c = curves[str(L)]
        ax.plot(c["positions"], c["loss"], label=f"L={L}", lw=1.2)
    train = _mark_train_len(ax, results, [0, *map(int, curves)] if curves else [])  # (positions 0 .. L - 1)
    ax.set_xlabel("token position t")
    ax.set_ylabel("mean loss at t (nats)")
    ax.set_title(_title(results, "Per-position loss"))
    ax.grid(alpha=0.3)
    _legend(ax, train, fontsize=8)
    fig.tight_layout()
    return fig


def _heatmap_figure(results: dict, task: str):
    grid = results.get(f"{task}_grid", {})
    lengths = _grid_lengths(results, grid)
    depths = [float(d) for d in results.get("depths", [])]
    data = np.full((len(depths), len(lengths)), np.nan)
    for j, L in enumerate(lengths):
        for i, d in enumerate(depths):
            v = (grid.get(str(L)) or {}).get(depth_key(d))
            if v is not None:
                data[i, j] = v
    # wide enough for the title and the axis label whatever the lengths: with two (1.2 + 0.9 * 2 inches) both were cut;
    # and for the run's label under the title (~0.09 inch a character)
    title_chars = max(map(len, [results.get("label") or "", *_extension_lines(results)]))
    width = max(4.0, 1.2 + 0.9 * len(lengths), 1.6 + 0.09 * title_chars)
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.55 * max(len(depths), 2)))
    import matplotlib

    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            ax.text(j, i, "n/a" if np.isnan(data[i, j]) else f"{data[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], rotation=45)
    ax.set_yticks(range(len(depths)), [depth_label(d) for d in depths])
    ax.set_xlabel("context length (tokens)")
    n = results.get("train_seq_len")
    if n:  # the columns right of the dashed line are lengths the model was not trained at, as in the other figures
        inside = sum(L <= n for L in lengths)
        if 0 < inside < len(lengths):
            ax.axvline(inside - 0.5, color="black", ls="--", lw=1.5)
        ax.set_xlabel(f"context length (tokens)\ntrained at {n}" + (" (dashed)" if 0 < inside < len(lengths) else ""))
    ax.set_ylabel("depth of the key")
    n = results.get("samples")
    ax.set_title(_title(results, f"{task} accuracy" + (f"\n({plural(n, 'prompt')} per cell)" if n else "")))
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig


def _retrieval_figure(results: dict):
    fig, ax = plt.subplots(figsize=(6, 4))
    for task in RETRIEVAL:
        xs = _lengths(results, task)
        if xs:
            ys = [results[task][str(x)] for x in xs]
            ns = [prompts(results, task, x) for x in xs]
            label = task + (f" (n={_prompt_counts(results, [task]).split(' ', 1)[1]})" if any(ns) else "")
            if all(ns):  # the 95 % interval of each accuracy: a few prompts per length are weak evidence
                lo, hi = zip(*(wilson_interval(y, n) for y, n in zip(ys, ns)))
                err = [[y - a for y, a in zip(ys, lo)], [b - y for y, b in zip(ys, hi)]]
                ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label=label)
            else:
                ax.plot(xs, ys, "o-", label=label)
    shown = [L for task in RETRIEVAL for L in _lengths(results, task)]
    train = _mark_train_len(ax, results, shown)
    _length_axis(ax, shown)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("exact-match accuracy")
    ax.set_title(_title(results, "Retrieval vs length"))
    ax.grid(alpha=0.3)
    _legend(ax, train)
    fig.tight_layout()
    return fig


def _grid_lengths(results: dict, grid: dict) -> List[int]:
    """Every evaluated length, measured or not: a length where the task was skipped or unsupported is a grey
    column / a row of dashes, not left out of the picture."""
    return sorted({int(k) for k in grid} | {int(L) for L in results.get("lengths", [])})


def _code_cell(text: str) -> str:
    """``text`` (repr'd: newlines visible) as a code span in a markdown table cell: a '|' in a model's output would
    end the cell (GitHub tables split on it even inside code) and a backtick the code span."""
    body = repr(text).replace("|", "\\|")
    return f"`` {body} ``" if "`" in body else f"`{body}`"


def depth_key(d: float) -> str:
    """A depth as the passkey / needle grids key it (``0.25``, ``1``); the suite seeds each depth's prompts by it.
    -0 is 0 (+ 0.0): keyed '-0', ``--depths 0,-0`` passed the repeat check and ran depth 0 twice, in two cells."""
    return f"{float(d) + 0.0:g}"


def depth_label(d: float) -> str:
    """A depth as the heatmaps, the grid tables and the examples label it: ``25%``, ``12.5%``, ``0.1%`` (rounded to
    whole percents, 0.125 read 12% and depths 0.001 and 0.004 were two rows both labelled 0%)."""
    return f"{100 * float(d) + 0.0:.6g}%"


def write_figures(results: dict, out_dir: Path) -> Dict[str, Path]:
    """Every figure the results have data for, as PNGs in ``out_dir`` (each of the names in FIGURES, written whole
    and moved in place); returns name -> path."""
    make_output_dir(out_dir)
    makers = {
        "ppl_vs_length": (lambda: _ppl_figure(results), any(_lengths(results, k) for k in ("ppl", "ppl_sliding"))),
        "per_position_loss": (lambda: _position_figure(results), bool(results.get("per_position_loss"))),
        "passkey_heatmap": (lambda: _heatmap_figure(results, "passkey"), bool(results.get("passkey_grid"))),
        "needle_heatmap": (lambda: _heatmap_figure(results, "needle"), bool(results.get("needle_grid"))),
        "retrieval_vs_length": (lambda: _retrieval_figure(results), any(_lengths(results, t) for t in RETRIEVAL)),
    }  # fmt: skip
    assert tuple(makers) == FIGURES
    paths = {}
    for name, (make, has_data) in makers.items():
        if not has_data:
            continue
        fig = make()
        path = out_dir / f"{name}.png"
        atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png"))
        plt.close(fig)
        paths[name] = path
    return paths


# ------------------------------------------------------------------------------------------------------ markdown


def markdown(results: dict, figures: Dict[str, Path]) -> str:
    """report.md: the run and its settings, the summary table by length, the retrieval grids, what was not
    measured, greedy continuations, the figures."""
    from minilm.runs import started_from_text  # (runs imports the config, which imports this package)

    ext = results.get("extension")
    title = results.get("label") or results.get("run")
    # the run's lines only where the results say them: evaluate(model, data, settings) on a model in memory has no
    # run, phase, step or position, and its report read "run: `None`, phase: `None`, step None" under an empty title
    lines = [
        "# Evaluation" + (f": {title}" if title else ""),
        "",
        *([f"- run: `{results.get('run')}`, phase: `{results.get('phase')}`, step {results.get('step')}"
           + (f" (step {results['phase_step']} of the phase)" if results.get("phase_step") is not None else "")]
          if results.get("run") is not None else []),
        *([f"- the phase started from {started_from_text(results['started_from'])}"]
          if "started_from" in results else []),  # (results.json of an older minilm does not record it)
        *([f"- position: `{json.dumps(results.get('position'))}`, trained at length {results.get('train_seq_len')}"]
          if results.get("position") is not None else []),
        f"- extension at evaluation: `{json.dumps(ext) if ext else 'none'}`",
        f"- tasks: {', '.join(results.get('tasks', []))}",
    ]
    tasks = set(results.get("tasks", []))
    if tasks & set(RETRIEVAL):  # (the prompts' depths and count: of no perplexity-only evaluation)
        lines[-1] += f"; depths: {results.get('depths')}; {plural(results.get('samples'), 'sample')} per retrieval cell"
    measured = tasks | ({"ppl_sliding"} if "ppl" in tasks and results.get("sliding", True) else set())
    recorded = [key for key, (metrics, _, _) in SETTINGS_READ_BY.items()  # those of a metric measured (not needles
                if key not in ("samples", "depths") and key in results and measured & set(metrics)]  # without needle)
    if recorded:  # (results.json of an older minilm does not record them)
        lines.append("- settings: " + ", ".join(f"{key} {_setting_text(key, results[key])}" for key in recorded))
    lines.append("")
    lines += _summary_lines(results) + _grid_lines(results) + _not_measured_lines(results)
    lines += _example_lines(results)
    if figures:
        lines += ["## Figures", ""] + [f"![{n}]({p.name})" for n, p in figures.items()] + [""]
    return "\n".join(lines)


def _summary_lines(results: dict) -> list[str]:
    cols = [c for c in SCALARS if c in results]
    lines = ["## Summary", "", "| length | " + " | ".join(cols) + " |", "|---:|" + "---:|" * len(cols)]
    unsupported = results.get("unsupported", {})
    # by length, as the grid tables and the figures: lengths are evaluated (and results.json keeps them) as given,
    # and --lengths 96,48 put 96 above 48 here while the heatmap table below read 48 first
    for L in sorted(results.get("lengths", [])):
        if str(L) in unsupported:
            lines.append(f"| {L} | " + " | ".join("unsupported" for _ in cols) + " |")
            continue
        cells = [_fmt(results[c].get(str(L)), "ppl") if c.startswith("ppl") else _acc_cell(results, c, L)
                 for c in cols]  # fmt: skip
        lines.append(f"| {L} | " + " | ".join(cells) + " |")
    counts = _prompt_counts(results, [c for c in cols if c in RETRIEVAL])
    # what the columns shown mean (a perplexity-only evaluation's note explained retrieval, and one without
    # sliding windows, or without perplexity at all, explained ppl_sliding)
    notes = {"ppl": "ppl: non-overlapping windows",
             "ppl_sliding": "ppl_sliding: sliding windows (after a document's first window, every scored token has "
                            "at least L − stride tokens of context)",
             "retrieval": "retrieval: exact-match accuracy of greedy decoding" + (
                 f" over n prompts per length ({counts}), in brackets its 95 % Wilson interval" if counts else "")}
    shown = [key for key in notes if key in cols or (key == "retrieval" and set(cols) & set(RETRIEVAL))]
    lines += ["", "; ".join(notes[key] for key in shown) + ".", ""] if shown else [""]  # fmt: skip
    packed, masked = _packed_lengths(results), _packed_lengths(results, masked=True)
    if packed:  # (results.json said so in details only: the table showed them as any other length's)
        lines += [f"Perplexity at {', '.join(map(str, packed))}: no held-out document holds L + 1 tokens, so it was "
                  "measured on the packed held-out stream (documents back to back): its windows cross document "
                  "boundaries, and the context they add is other documents' text.", ""]  # fmt: skip
    if masked:  # (a run trained with data.document_mask: scored as its packed rows were trained)
        restart = _packed_lengths(results, masked=True, restart=True)
        how = " and positions restarting at each document start" if restart else ""
        lines += [f"Perplexity at {', '.join(map(str, masked))}: no held-out document holds L + 1 tokens, so it was "
                  "measured on the packed held-out stream (documents back to back), with attention masked within "
                  f"each document{how}, as the run's packed rows were trained (data.document_mask): no target has "
                  "more context than its own document.", ""]  # fmt: skip
    return lines


def _packed_lengths(results: dict, masked: bool = False, restart: bool = False) -> List[int]:
    """The lengths whose perplexity read the packed held-out stream (``details.ppl.L.<mode>.source``): without
    document masks, or (``masked``) with them (``document_mask``; ``restart``: and ``restart_positions``)."""
    per_length = (results.get("details") or {}).get("ppl") or {}

    def read(m) -> bool:
        return (isinstance(m, dict) and m.get("source") == "packed" and bool(m.get("document_mask")) == masked
                and (not restart or bool(m.get("restart_positions"))))  # fmt: skip

    return sorted(int(L) for L, modes in per_length.items() if any(read(m) for m in (modes or {}).values()))


def _grid_lines(results: dict) -> list[str]:
    """The passkey and needle grids, length × depth."""
    lines = []
    for task in ("passkey", "needle"):
        grid = results.get(f"{task}_grid")
        if not grid:
            continue
        depths = [depth_key(d) for d in results.get("depths", [])]
        header = "| length | " + " | ".join(depth_label(d) for d in depths) + " |"
        lines += [f"## {task}: length × depth", ""]
        if results.get("samples"):
            lines += [f"Exact-match accuracy over {plural(results['samples'], 'prompt')} per cell.", ""]
        lines += [header, "|---:|" + "---:|" * len(depths)]
        for L in _grid_lengths(results, grid):
            row = grid.get(str(L)) or {}
            lines.append(f"| {L} | " + " | ".join(_fmt(row.get(d), "acc") for d in depths) + " |")
        lines.append("")
    return lines


def not_measured(results: dict) -> list[str]:
    """What was not measured and why, one item per length or task: the report's "Not measured" section, and the
    message of an evaluation that measured nothing."""
    unsupported, skipped = results.get("unsupported", {}), results.get("skipped", {})
    return ([f"length {L}: unsupported — {why}" for L, why in unsupported.items()]
            + [f"{task} at {L}: skipped — {why}" for task, per in skipped.items() for L, why in per.items()])


def _not_measured_lines(results: dict) -> list[str]:
    items = not_measured(results)
    return ["## Not measured", "", *(f"- {item}" for item in items), ""] if items else []


def _example_lines(results: dict) -> list[str]:
    examples = results.get("examples", {})
    if not any(examples.values()):
        return []
    lines = ["## Greedy continuations (one sample per length)", "", "| task | length | depth | answer | greedy |",
             "|---|---:|---:|---|---|"]  # fmt: skip
    for task, rows in examples.items():
        for r in sorted(rows, key=lambda r: r["length"]):  # (by length, as the tables above)
            d = "" if r.get("depth") is None else depth_label(r["depth"])
            cells = [task, str(r["length"]), d, _code_cell(r["answer"]), _code_cell(r["greedy"])]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def write_report(results: dict, out_dir: Path) -> Dict[str, Path]:
    """results.json + figures + report.md in ``out_dir``; returns the figures written. A folder that held an
    evaluation before loses the figures this one did not draw (a task left out now), so report, results and
    figures agree, and the temporary files a killed evaluation left while writing them; other files are left
    alone. results.json goes first and comes back last: a folder without it holds no finished evaluation (a kill
    between the files left the new results.json beside the old report and figures)."""
    out_dir = Path(out_dir)
    # (only the evaluation's own: --out may be any folder, compare_runs.py's default the current one)
    remove_stale_temporaries(out_dir, {"results.json", "report.md", *(f"{name}.png" for name in FIGURES)})
    evaluated_before = (out_dir / "results.json").is_file()
    (out_dir / "results.json").unlink(missing_ok=True)
    figures = write_figures(results, out_dir)
    atomic_write_text(out_dir / "report.md", markdown(results, figures))
    if evaluated_before:
        for name in FIGURES:
            if name not in figures:
                (out_dir / f"{name}.png").unlink(missing_ok=True)
    write_json(results, out_dir / "results.json")
    return figures


# --------------------------------------------------------------------------------------------------- tensorboard


def log_tensorboard(writer, results: dict, figures: Dict[str, Path], step: int, prefix: str = "eval") -> None:
    """Scalars ``<prefix>/<metric>@<L>`` and the figures as images, at ``step``; ``writer`` is a SummaryWriter."""
    for key in SCALARS:
        for L, v in results.get(key, {}).items():
            if v is not None and math.isfinite(v):
                writer.add_scalar(f"{prefix}/{key}@{L}", v, global_step=step)
    for name, path in figures.items():
        img = plt.imread(str(path))  # (H, W, 4) float in [0, 1]
        writer.add_image(f"{prefix}/{name}", img[..., :3], global_step=step, dataformats="HWC")
    writer.add_text(f"{prefix}/report", markdown(results, {}), global_step=step)
    writer.flush()


# ------------------------------------------------------------------------------------------------------ compare

# results.json key -> (the metrics whose numbers it changes, why, the scripts/evaluate.py flag that sets it): the same
# weights evaluated with other values give other numbers, so compare() warns when the evaluations it overlays differ
SETTINGS_READ_BY = {
    "seed": (("ppl", "ppl_sliding", *RETRIEVAL), "it draws the perplexity windows and the retrieval prompts, so "
             "they were measured on different text", "--seed"),
    "batches": (("ppl", "ppl_sliding"), "perplexity averages batches × max(1, batch_tokens // L) windows per length",
                "--batches"),
    "batch_tokens": (("ppl", "ppl_sliding"), "perplexity averages batches × max(1, batch_tokens // L) windows per "
                     "length", "--batch-tokens"),
    "stride": (("ppl_sliding",), "the sliding windows' stride sets how much context each scored token has",
               "--stride"),
    "samples": (RETRIEVAL, "each accuracy counts other prompts", "--samples"),
    "depths": (RETRIEVAL, "each length's accuracy is the mean over other depths", "--depths"),
    "needles": (("needle",), "the needle prompts hold other numbers of distractors", "--needles"),
}  # fmt: skip


def _setting_text(key: str, value) -> str:
    if key == "stride" and value is None:
        return "L/2"
    return json.dumps(value)


def setting_differences(runs: Sequence[dict], labels: Sequence[str]) -> list[str]:
    """Warnings for compare(): one per evaluation setting (SETTINGS_READ_BY) in which the evaluations that measured a
    metric it changes differ, naming each value and the runs evaluated with it; one where perplexities of tokenizers
    of other vocabulary sizes (other units of text) are overlaid; and one per such evaluation whose results.json
    predates the record of a setting (evaluated by an older minilm), which cannot be checked."""
    out, unknown = [], {}
    for key, (metrics, why, flag) in SETTINGS_READ_BY.items():
        by_value: Dict[str, List[str]] = {}
        for r, label in zip(runs, labels):
            if not any(_lengths(r, m) for m in metrics):
                continue
            if key in r:
                by_value.setdefault(_setting_text(key, r[key]), []).append(label)
            else:
                unknown.setdefault(label, []).append(key)
        if len(by_value) > 1:
            values = "; ".join(f"{value} ({', '.join(who)})" for value, who in by_value.items())
            out.append(f"evaluated with different {key}: {values}. {why[0].upper()}{why[1:]}: compare them evaluated "
                       f"with the same {flag} (scripts/evaluate.py)")  # fmt: skip
    sizes = {}  # perplexity is per token: runs of other tokenizers count other units
    for r, label in zip(runs, labels):
        if r.get("vocab_size") is not None and any(_lengths(r, m) for m in ("ppl", "ppl_sliding")):
            sizes.setdefault(r["vocab_size"], []).append(label)
    if len(sizes) > 1:
        values = "; ".join(f"{size} ({', '.join(who)})" for size, who in sizes.items())
        out.append(f"tokenizers of different vocabulary sizes: {values}. Perplexity is per token, and their tokens are "
                   "different units of text: compare the perplexities of runs that share a tokenizer")
    else:
        out += _data_differences(runs, labels)
    if len(runs) > 1:
        out += [f"{label}: its results.json does not record {', '.join(keys)} (written by an older minilm), so whether "
                "the others were evaluated alike cannot be checked; evaluate it again"
                for label, keys in unknown.items()]  # fmt: skip
    return out


def _data_differences(runs: Sequence[dict], labels: Sequence[str]) -> list[str]:
    """Warnings for perplexities measured with other tokenizers of one vocabulary size (other model files: another
    corpus or tokenizer type trains other pieces), or, with one tokenizer, on other held-out documents (another
    corpus or split): their numbers are not comparable either. From the digests results.json records
    (``tokenizer_sha256``, ``val_sha256``); an evaluation without them is not compared."""
    measured = [(r, label) for r, label in zip(runs, labels) if any(_lengths(r, m) for m in ("ppl", "ppl_sliding"))]
    for key, what in (("tokenizer_sha256", "different tokenizers (of one vocabulary size): {}. Perplexity is per "
                                           "token, and their tokens are different units of text: compare the "
                                           "perplexities of runs that share a tokenizer"),
                      ("val_sha256", "evaluated on different held-out documents: {}. Their perplexities measure "
                                     "other text (another corpus, sources or data.val_fraction): compare runs "
                                     "trained on the same data")):  # fmt: skip
        by_digest: Dict[str, List[str]] = {}
        for r, label in measured:
            if r.get(key):
                by_digest.setdefault(r[key], []).append(label)
        if len(by_digest) > 1:  # (the tokenizers first: with other ones, other held-out tokens follow)
            return [what.format("; ".join(f"sha256 {d[:12]} ({', '.join(who)})" for d, who in by_digest.items()))]
    return []


def compare(runs: Sequence[dict], labels: Sequence[str], out_dir: Path) -> tuple[Path, Path]:
    """Overlay several evaluations (one ``results.json`` each): one figure (perplexity and every retrieval task
    vs length, one line per run) and one markdown table. Returns (figure, table) paths."""
    out_dir = Path(out_dir)
    make_output_dir(out_dir)
    remove_stale_temporaries(out_dir, {"compare.png", "compare.md"})
    panels = [k for k in ("ppl", "ppl_sliding", *RETRIEVAL) if any(_lengths(r, k) for r in runs)] or ["ppl"]
    fig_path, table_path = out_dir / "compare.png", out_dir / "compare.md"
    _compare_figure(runs, labels, panels, fig_path)
    atomic_write_text(table_path, _compare_table(runs, labels, panels, fig_path.name))
    return fig_path, table_path


def _compare_figure(runs: Sequence[dict], labels: Sequence[str], panels: list[str], path: Path) -> None:
    """One panel per metric, one line per run, a vertical line at each training length."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
    train_lens = sorted({r.get("train_seq_len") for r in runs if r.get("train_seq_len")})
    every = [L for key in panels for r in runs for L in _lengths(r, key)]  # the legend's note: of every panel
    # each run's colour and marker, the same in every panel: a panel takes the colours of its own lines in turn, so
    # where the first run had no needle scores the second run's needle line was drawn in the first run's colour
    styles = [_run_style(i) for i in range(len(runs))]
    train = []
    for ax, key in zip(axes[0], panels):
        for r, label, style in zip(runs, labels, styles):
            xs = _lengths(r, key)
            if xs:
                ax.plot(xs, [r[key][str(x)] for x in xs], ls="-", label=label, **style)
        shown = [L for r in runs for L in _lengths(r, key)]
        for i, n in enumerate(train_lens):  # named in the legend: with several, which run was trained where
            who = [lb for r, lb in zip(runs, labels) if r.get("train_seq_len") == n]
            # (wrapped: one line naming a study's 30 runs made the legend, and so the image, thousands of pixels wide)
            text = textwrap.fill(f"trained at {n}" + (f" ({', '.join(who)})" if len(train_lens) > 1 else ""), 60,
                                 break_long_words=False, break_on_hyphens=False)  # fmt: skip
            ls = ("--", ":", "-.")[i % 3]
            _train_len_line(ax, n, shown, ls=ls)
            if ax is axes[0][0]:
                train.append(_train_len_handle(n, every, text, ls=ls))
        _length_axis(ax, shown)
        if key.startswith("ppl"):
            _ppl_axis(ax)
        else:
            ax.set_ylim(-0.05, 1.05)
            ax.set_ylabel("exact-match accuracy")
        ax.set_xlabel("context length (tokens)")
        ax.set_title(key)
        ax.grid(alpha=0.3, which="both")
    # one legend for every panel (each draws the runs in the same styles), right of the last one, outside the
    # axes: inside the first panel it covered the curves it names. Every run's entry, also of a run the first panel
    # has no line of (one evaluated on retrieval alone)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="-", label=label, **style) for label, style in zip(labels, styles)]
    legend = axes[0][-1].legend(handles=handles + train, fontsize=8, loc="upper left", bbox_to_anchor=(1.03, 1.0),
                                borderaxespad=0)
    # out of tight_layout, which fitted the legend into the figure's width by narrowing the panels (many or long
    # labels: every panel a sliver, its length ticks written over each other); the saved image is widened to hold
    # it instead (bbox_extra_artists: bbox_inches="tight" alone leaves out what is out of the layout)
    legend.set_in_layout(False)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=110, format="png", bbox_inches="tight",
                                             bbox_extra_artists=[legend]))  # fmt: skip
    plt.close(fig)


def _run_style(i: int) -> dict:
    """The colour and marker of the ``i``-th run of a comparison: the colour cycle's, and past its colours (a study's
    folder gives one run per variant and seed) another marker, so no two of the first 50 runs look alike."""
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {"color": colours[i % len(colours)], "marker": "os^Dv"[i // len(colours) % 5]}


def _compare_table(runs: Sequence[dict], labels: Sequence[str], panels: list[str], figure: str) -> str:
    """compare.md: each run's settings, then per metric a table of runs × lengths."""
    lengths = sorted({int(L) for r in runs for L in r.get("lengths", [])})
    lines = ["# Comparison", ""]
    warnings = setting_differences(runs, labels)
    if warnings:
        lines += ["**The numbers below are not measured alike:**", "", *(f"- {w}" for w in warnings), ""]
    for r, label in zip(runs, labels):
        ext = r.get("extension")
        lines.append(f"- **{label}**: `{r.get('run')}` phase `{r.get('phase')}`, position "
                     f"`{json.dumps(r.get('position'))}`, trained at {r.get('train_seq_len')}"
                     + (f", extension `{json.dumps(ext)}`" if ext else ""))  # fmt: skip
    lines.append("")
    for key in panels:
        lines += [f"## {key}", ""]
        counts = [(label, _prompt_counts(r, [key])) for r, label in zip(runs, labels)]
        if key in RETRIEVAL and any(c for _, c in counts):
            lines += ["Exact-match accuracy [95 % Wilson interval] over n prompts per length: "
                      + "; ".join(f"{label} {c.split(' ', 1)[1]}" for label, c in counts if c) + ".", ""]  # fmt: skip
        lines += ["| run | " + " | ".join(str(L) for L in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for r, label in zip(runs, labels):
            # a '|' in a label (--label, run.name) ended its cell: the row had a column too many, shifted right
            row = label.replace("|", "\\|")
            lines.append(f"| {row} | " + " | ".join(_compare_cell(r, key, L) for L in lengths) + " |")
        lines.append("")
    return "\n".join(lines + [f"![compare]({figure})", ""])


def _compare_cell(r: dict, key: str, L: int) -> str:
    if str(L) in r.get("unsupported", {}):
        return "unsupp."
    return _fmt(r.get(key, {}).get(str(L)), "ppl") if key.startswith("ppl") else _acc_cell(r, key, L)
