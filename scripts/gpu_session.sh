#!/usr/bin/env bash
# The GPU measurements of docs/performance.md ("GPU results"), in parts. Run from the repository root:
#
#   bash scripts/gpu_session.sh PART [PART ...]
#
#   check      versions, the GPU, one short uncompiled step of the config (no tables written): run first
#   attn       the attention core alone (scripts/bench_attention.py), five encodings at 1K, then 8K, then 32K tokens
#   attn-direct  RoPE, T5, KERPLE at 8K with T5's and KERPLE's direct score_mods (--no-flex-table): the A/B of
#              the per-distance tables their FlexAttention backward scatters into (minilm/positions/bias.py)
#   attn-copies  RoPE, T5, KERPLE, FIRE at 1K and 8K with each learned table in COPIES copies (default 8;
#              --flex-table-copies): does spreading the backward's atomic adds help? (against attn's rows)
#   attn-split RoPE and T5 at 1K and 8K with T5 in near and far FlexAttention parts (--flex-split): its atomic
#              adds for the near keys alone (against attn's rows)
#   attn-forwards  RoPE and KERPLE at 1K and 8K with KERPLE's r1, r2 given their gradients by two extra forwards
#              (--kerple-forwards): the kernel's atomic adds gone (against attn's rows)
#   sdpa       RoPE with each of SDPA_KERNELS first (model.sdpa_kernel; default flash,cudnn): the attention core
#              alone at 1K and 8K (docs tables), then the training step at 1024 tokens (results files only): does
#              cuDNN's attention beat flash's on this GPU? (the step against peer's minilm row too)
#   autotune   RoPE at 1024 tokens compiled with train.compile_mode=max-autotune-no-cudagraphs (inductor times
#              its GEMM configurations: minutes of compiling): MFU at 1K against peer's minilm row (results
#              files only)
#   autotune-8k  RoPE and ALiBi at 8192 tokens, the same mode (chunked loss): does autotuning FlexAttention's
#              block sizes close ALiBi's gap to RoPE at 8K (enc-8k's 0.67x)? (results files only)
#   batch      RoPE at 1024 tokens with other micro-batches, BATCH_SIZES (default 32,64; the config's is 16):
#              does MFU at 1K grow with the batch? (results files only, no docs table)
#   trainer    the step through train.py's loop (scripts/benchmark.py --trainer: LitGPT in Lightning's Trainer)
#              against the plain loop: the config at 1024 tokens, then configs/tiny.yaml (a step short enough for
#              the host's time per step to show) (results files only)
#   profile    where a step's time goes: torch.profiler tables (scripts/benchmark.py --profile) of RoPE at 1K
#              (the peer's setting), then RoPE, ALiBi and T5 at 8K (chunked loss); no docs table
#   peer       the config at 1024 tokens against the Hugging Face peer (MFU, ratio)
#   peer-chunked  the same with the chunked loss (model.loss_chunk_size=4096)
#   enc-1k     RoPE, ALiBi, T5, KERPLE, FIRE at 1024 tokens (chunked loss)
#   enc-8k     the same at 8192 tokens
#   long       batch 1 at 16K, 32K, 64K, 128K tokens, no activation checkpointing
#   long-ckpt  the same with activation checkpointing
#   tests      python -m pytest -m gpu
#
# The parts run in the order given, inside one time budget: BUDGET seconds (default 540, under the device tool's
# 10 minutes per command) from the start. Each part runs under `timeout -s INT` with what is left of it, so a
# part that runs long is stopped with its finished measurements written (scripts/benchmark.py saves after each
# one and marks the table partial), and the parts after it are skipped; a machine start is not wasted on one
# slow part. (Durations on an H100: check 30 s, peer 1.6 min, enc-1k 6 min, about 1.5 min per encoding at 8K.)
#
# Every benchmark part writes benchmarks/results/*.{json,md} and its table in docs/performance.md
# (--update-docs). Where $OUT is set (the device tool's output folder), the parts leave there two files, however
# many run (the tool brings back at most 8): gpu-session.log (everything printed, part by part) and
# gpu-results.tgz (benchmarks/results and docs/performance.md, rewritten after each part): unpack it in the
# checkout (tar xzf gpu-results.tgz) to take the results home.
#
# Packages the GPU image lacks travel as wheels in .whl/ (`make gpu-wheels` downloads them; pass .whl in the
# device tool's carry); they are installed into /tmp/site first (WHEELS names another folder). GPU_CONFIG picks
# another config (default configs/gpt2_small.yaml); PYTHON another interpreter. To re-measure part of a part:
# ENCODINGS for attn, attn-copies, autotune-8k, enc-* and profile's 8K (defaults above; keep rope for the "vs
# RoPE" column), LONG_LENGTHS for long* (default 16384,32768,65536,131072), ATTN_LENGTHS for attn, attn-copies,
# attn-split and attn-forwards (defaults above), COPIES for attn-copies, BATCH_SIZES
# for batch, SDPA_KERNELS for sdpa (model.sdpa_kernel values but auto), PYTEST_ARGS added to tests (say "-x"; split
# at spaces), PYTEST_K its -k expression (one argument, spaces and all: "fire or copies or parts").
# DRY_RUN=1 prints each part's command instead of running it.
set -uo pipefail

parts_known="check attn attn-direct attn-copies attn-split attn-forwards sdpa peer peer-chunked autotune autotune-8k
batch enc-1k enc-8k long long-ckpt profile trainer tests"
parts_known=${parts_known//$'\n'/ }
usage="usage: bash scripts/gpu_session.sh PART [PART ...], parts: ${parts_known// /, }"
[ $# -gt 0 ] || { echo "$usage (got none)" >&2; exit 2; }
for part in "$@"; do
    case " $parts_known " in
    *" $part "*) ;;
    *) echo "$usage (got '$part')" >&2; exit 2 ;;
    esac
done
budget=${BUDGET:-540}
[[ $budget =~ ^[0-9]+$ ]] || { echo "BUDGET must be a whole number of seconds, got '$budget'" >&2; exit 2; }
deadline=$((SECONDS + budget))
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}
cfg=${GPU_CONFIG:-configs/gpt2_small.yaml}
out=${OUT:-}

# what is left of the budget, less 15 s for the tarball; SIGINT lets the benchmark and pytest write what they have
limited() {
    if [ -n "${DRY_RUN:-}" ]; then # each argument as the command receives it: one with spaces in quotes
        local arg line="would run:"
        for arg in "$@"; do [[ $arg == *" "* ]] && line+=" '$arg'" || line+=" $arg"; done
        echo "$line"
        return 0
    fi
    local left=$((deadline - SECONDS - 15))
    if ((left <= 0)); then # a part of several commands (sdpa, batch) past the budget: skip, as the loop does parts
        echo "gpu_session $part: skipped ${*:1:3} ..., the $budget s budget is spent" >&2
        return 124
    fi
    timeout -s INT -k 30 "$left" "$@"
}
bench() { limited $py scripts/benchmark.py --config "$cfg" "$@"; }
encodings=${ENCODINGS:-rope,alibi,t5,kerple,fire}
copies=${COPIES:-8}
batch_sizes=${BATCH_SIZES:-32,64}
[[ $batch_sizes =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
    { echo "BATCH_SIZES must be whole numbers >= 1 separated by commas, got '$batch_sizes'" >&2; exit 2; }
[[ $copies =~ ^[1-9][0-9]*$ ]] || { echo "COPIES must be a whole number >= 1, got '$copies'" >&2; exit 2; }
sdpa_kernels=${SDPA_KERNELS:-flash,cudnn}
[[ $sdpa_kernels =~ ^(flash|cudnn|efficient)(,(flash|cudnn|efficient))*$ ]] ||
    { echo "SDPA_KERNELS must be flash, cudnn or efficient, separated by commas, got '$sdpa_kernels'" >&2; exit 2; }
long_lengths=${LONG_LENGTHS:-16384,32768,65536,131072}

# (after the settings are checked: a bad one is refused before anything is installed)
wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$wheels"/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # pytest imports minilm from the checkout, uninstalled

run_part() {
    case $part in
    check)
        command -v nvidia-smi >/dev/null && nvidia-smi
        # (the benchmark prints the device and the versions first: no second process to import them)
        bench --steps 2 --warmup 1 --no-compile --batch-size 1 --out "${TMPDIR:-/tmp}/minilm-check"
        ;;
    attn)
        limited $py scripts/bench_attention.py --config "$cfg" --lengths "${ATTN_LENGTHS:-1024,8192,32768}" \
            --encodings "$encodings" --update-docs
        ;;
    attn-direct)
        limited $py scripts/bench_attention.py --config "$cfg" --lengths 8192 --encodings rope,t5,kerple \
            --no-flex-table --tag direct --update-docs
        ;;
    attn-copies)
        limited $py scripts/bench_attention.py --config "$cfg" --lengths "${ATTN_LENGTHS:-1024,8192}" \
            --encodings "${ENCODINGS:-rope,t5,kerple,fire}" --flex-table-copies "$copies" --tag "copies$copies" \
            --update-docs
        ;;
    attn-forwards)
        limited $py scripts/bench_attention.py --config "$cfg" --lengths "${ATTN_LENGTHS:-1024,8192}" \
            --encodings rope,kerple --kerple-forwards --tag forwards --update-docs
        ;;
    sdpa)
        local k rc=0
        for k in ${sdpa_kernels//,/ }; do
            limited $py scripts/bench_attention.py --config "$cfg" --lengths 1024,8192 --encodings rope \
                --tag "sdpa-$k" --update-docs "model.sdpa_kernel=$k" || rc=$?
        done
        for k in ${sdpa_kernels//,/ }; do
            bench --lengths 1024 --steps 20 --warmup 5 --tag "sdpa-$k" "model.sdpa_kernel=$k" || rc=$?
        done
        return $rc
        ;;
    autotune)
        bench --lengths 1024 --steps 20 --warmup 5 --tag autotune train.compile_mode=max-autotune-no-cudagraphs
        ;;
    autotune-8k)
        bench --lengths 8192 --encodings "${ENCODINGS:-rope,alibi}" --steps 10 --warmup 3 --tag autotune-8k \
            train.compile_mode=max-autotune-no-cudagraphs model.loss_chunk_size=4096
        ;;
    batch)
        local b rc=0
        for b in ${batch_sizes//,/ }; do
            bench --lengths 1024 --batch-size "$b" --steps 20 --warmup 5 --tag "batch$b" || rc=$?
        done
        return $rc
        ;;
    attn-split)
        limited $py scripts/bench_attention.py --config "$cfg" --lengths "${ATTN_LENGTHS:-1024,8192}" \
            --encodings rope,t5 --flex-split --tag split --update-docs
        ;;
    profile)
        bench --lengths 1024 --steps 5 --warmup 3 --profile --tag profile-1k &&
            bench --lengths 8192 --encodings "${ENCODINGS:-rope,alibi,t5}" --steps 5 --warmup 3 --profile \
                --tag profile-8k model.loss_chunk_size=4096
        ;;
    trainer)
        bench --lengths 1024 --trainer --steps 30 --warmup 5 --repeats 2 --tag trainer &&
            limited $py scripts/benchmark.py --config configs/tiny.yaml --trainer --steps 100 --warmup 10 \
                --repeats 2 --tag trainer
        ;;
    peer) # each repeat builds and compiles both models again, and the interleaved ratio once more
        bench --lengths 1024 --peer --steps 20 --warmup 5 --repeats 2 --update-docs
        ;;
    peer-chunked)
        bench --lengths 1024 --peer --steps 20 --warmup 5 --repeats 2 --tag chunked --update-docs \
            model.loss_chunk_size=4096
        ;;
    enc-1k | enc-8k)
        local T=1024
        [ "$part" = enc-8k ] && T=8192
        bench --lengths $T --encodings "$encodings" --steps 10 --warmup 3 --tag "$part" \
            --update-docs model.loss_chunk_size=4096
        ;;
    long)
        bench --lengths $long_lengths --batch-size 1 --steps 5 --warmup 2 --tag long --update-docs \
            model.loss_chunk_size=4096
        ;;
    long-ckpt)
        bench --lengths $long_lengths --batch-size 1 --steps 5 --warmup 2 --tag long-ckpt --update-docs \
            model.loss_chunk_size=4096 model.activation_checkpointing=true
        ;;
    tests)
        # torch's DEBUG trace logging, which pytest would capture and print with every failure, stays out
        local select=()
        [ -n "${PYTEST_K:-}" ] && select=(-k "$PYTEST_K")
        # shellcheck disable=SC2086 # PYTEST_ARGS is split into arguments on purpose
        limited $py -m pytest -m gpu -q --log-level=WARNING "${select[@]}" ${PYTEST_ARGS:-}
        ;;
    esac
}

status=0
for part in "$@"; do
    if ((deadline - SECONDS < 60)); then
        echo "gpu_session $part: skipped, $((deadline - SECONDS)) s of the $budget s budget left" >&2
        status=124
        continue
    fi
    if [ -z "$out" ]; then
        run_part
        rc=$?
    else # two files whatever the parts: the device tool brings back at most 8 from $OUT
        mkdir -p "$out"
        { echo "=== gpu_session $part ($(date -u '+%F %T UTC')) ==="; run_part; } 2>&1 | tee -a "$out/gpu-session.log"
        rc=${PIPESTATUS[0]}
        # every part's results so far (a superset of the last tarball's), replaced whole, never half-written
        tar czf "$out/gpu-results.tgz.part" benchmarks/results docs/performance.md &&
            mv -f "$out/gpu-results.tgz.part" "$out/gpu-results.tgz"
        echo "gpu_session $part: exit $rc; results in $out/gpu-results.tgz" | tee -a "$out/gpu-session.log"
    fi
    ((rc == 0)) || status=$rc
done
exit "$status"
