"""The default GPU job's stopping rules, in a module without imports: `python -m tuner run --help`
names them before PyTorch loads (`tuner.cli`), and `tuner.search.search` applies them."""

DEFAULT_TRIALS = 40
MAX_TRIALS = 1000
"""The number of trials a job asks for, the same on the CLI (`--trials`), in `RunOptions` and in the
API (`trials`; `n_trials` until 2026-11-27): 40 by default, 1 to 1000. 40 is what the measured
default jobs ran with (docs/benchmarks/README.md): on a GPU the search budget and the patience below
end a job first (4-8 trials at 0.4-1.1B, 16-22 at 125M), so a larger default would change nothing
there, and on a CPU 40 trials of a small model take minutes. Until 2026-11-27 the API took 20 by
default and at most 500, and the CLI at most 100000. 1000 bounds one job's study for a shared
service (each trial reads the study's history) and still lets a patient user search longer than any
measured job ran."""
MAX_PATIENCE = 100_000
"""The largest `patience` a request may ask (`RunOptions`, the API's `patience`)."""
MAX_MEMORY_BYTES = 2**50
"""The largest memory cap a request may give (`--max-memory`, the API's `max_memory_bytes`): 1 PiB,
beyond any device's memory, so a larger number is a typo, not a cap."""
DEFAULT_WARMUP = 10
DEFAULT_WINDOWS = 5
DEFAULT_WINDOW_STEPS = 20
"""A measurement: DEFAULT_WARMUP untimed steps, then DEFAULT_WINDOWS timed windows of
DEFAULT_WINDOW_STEPS steps (`tuner.search.measuring.measure.Protocol`)."""
SCALE_WINDOW_STEPS = 10
"""Steps per timed window on the scale space given no --window-steps. A step of the 1.1B preset
takes 225-350 ms on an H100, so the default 110-step measurement cost 25-40 s and a default job
measures 11 times or more (two baselines, four corners, the final round's five): about 5 minutes
of the 979 s the job took at 130e597. Ten steps make a window of 2-4 s, 100-300x the timer's
resolution; the run-to-run spread there was 0.2 % (CI 225.2-225.6 ms over 20-step windows); and
ten is the default loss-read cadence (event every 10), so every window holds the same number of
reads. A model under 250M parameters keeps DEFAULT_WINDOW_STEPS: its steps take 2-40 ms, and a
window of 20 is 40-800 ms. Measured at 3393cc6 on the same job (H100, 2026-11-26): 17-20 s a
trial's measurement instead of 25-28 s, the final round 108 s instead of 243 (with c38c074's
cut), the job 818 s, the recommendation's CI 222.6-223.6 ms
(docs/benchmarks/default-job-h100-2026-11-26-llama-1b-3393cc6.md)."""
AUTO_SEARCH_BUDGET_S = 240.0
"""The search budget of a job on the default space on a GPU given no --timeout: trials stop
starting after it (a trial under way finishes), then the final round runs (about 75 s on
transformer large on an H100). Chosen for issue 29's aim, a default job on a 125M model in at
most 8 minutes from a cold compile cache: a cold compiled trial of GPT-2 or a Llama-style 125M
decoder costs 60-145 s on an H100, the baselines, final round and profiles about 3 minutes more.
It was 600 s until 2026-11-25: the default job then ran about a quarter of an hour on such a
model. Not yet timed on an H100 at this value (docs/benchmarks/README.md says when it is)."""
AUTO_SCALE_BUDGET_S = 480.0
"""The search budget of a job on the scale space (what the default space means on a GPU for a
model of 0.3-8B parameters) given no --timeout. Its four lever corners (each block compiled,
the whole model compiled, 2 micro-batches, selective checkpointing) took 503 s on the 1.1B
preset (8 x 2048 tokens) from a cold cache on an H100, the first 205 s of it (its gate measured
the reference and the envelope), the others 82-133 s (docs/benchmarks/raw/
default-job-h100-2026-11-26-llama-1b-396a502/): a trial under way finishes, so 480 s after the
first trial starts lets the last corner start and no fifth trial, and that job answered in
about 13 minutes with its final round and profiles (issue 32's aim: 15). Without a budget that
job ran 40 trials, 25 of them after the fastest had been found (tests/tuner/search/test_search.py
replays it). Since then the screen and the predictions skip most trials (the Qwen1.5-0.5B shape's
trials ended at 412 s on one H200 at 0920146), and the job's time aim (`SCALE_JOB_AIM_S`, 600 s)
cuts the final round's optional parts and the profiles where trials run on near the budget."""
SCALE_JOB_AIM_S = 600.0
"""On the scale space, the job's time aim for its final round's optional parts (a tied config's
gate, a round after the first: `tuner.search.deciding.aim.final_aim`) and, with `--profile
baselines` (the default), its profiles after the decision, each started only where its expected
cost still ends the job inside this (`--profile all` takes every one). The baselines are profiled
first, as they are cheap, then the recommended config. Issue 55 asks a cold 1B job to answer in
10 minutes (issue 47 asked 15 and this was 900 s until 2026-12-02): on one H200 at 0920146 the
Qwen1.5-0.5B shape's cold job began its final round at 488 s and ended at 898 s, of which a
tied config's gate 86 s and a second round 134 s for the same decision
(docs/benchmarks/README.md, 2026-12-02). The search's own budget (`AUTO_SCALE_BUDGET_S`) is
unchanged: the trials are where a faster config is found, and a config ahead of every gated one
by more than a tie is gated whatever the time."""
REPEAT_JOB_AIM_S = 240.0
"""On the scale space, the aim of a job that starts from an earlier study's trials
(`tuner.search.earlier`: a repeat job, in place of `SCALE_JOB_AIM_S`) for its final round's
optional parts (`tuner.search.deciding.aim.final_aim`) and, with `--profile baselines`, its
profiles: a user tunes again whenever the model, the batch or the code changes, and a repeat
job is asked to answer within 4 minutes. The profiles its earlier job measured are copied
whatever the time (`tuner.search.deciding.profiling.profile_recommendation`); those it had left
out for its own aim would take most of those minutes: at 46a3e5a on one H200 the Qwen1.5-0.5B
shape's repeat job spent 223 s of its 393 s profiling the baselines and the recommended config,
which the cold job had left out at 886 s
(docs/benchmarks/time-to-answer-h200-2026-12-01-qwen15.md)."""
PROFILE_CHILD_S = 40.0
"""Expected seconds to start the profiles' child process and build the workload in it: 31.7 s
at 0.4B, 38.7 s at 1.1B (the profile phase less its profiles' own seconds, one H100 each, at
dac6cd4: docs/benchmarks/raw/heldout-h100x4-2026-11-27-dac6cd4/)."""
PROFILE_EAGER_S = 25.0
"""Expected seconds of one profile of an eager config (a baseline): 12.9-13.2 s at 0.4B there,
22.4 s (25.6 s to the next line of the job) at 1.24B on one H200 (b58d9ad:
`docs/benchmarks/raw/beyond-h200x2-2026-11-30-b58d9ad/beyond-llama3.2-1b.log`)."""
PROFILE_MARGIN_S = 15.0
"""Seconds a profile's expected end keeps clear of `SCALE_JOB_AIM_S`: the job's own end after its
last profile (the recommendation stored, the profiles' child stopped, the process's exit). In the
time-to-answer records of one H200 (2026-11-28 to 2026-12-04) the process ended 5-6 s after its
`done` line, and that line came 5-7 s after the session's clock was stored; until 2026-12-04 the
clock also started only once PyTorch and Optuna were loaded (5-7 s after the command), so the
Qwen2-style cold job at 25842a9 ran 622 s by its caller's clock against 604 s by its own
(`docs/benchmarks/time-to-answer-h200-2026-12-04-qwen2-25842a9.md`). `python -m tuner run` now
starts the clock with the command (`tuner.search.measuring.timing.Clock`'s `origin`). It was 10 s
until then: at b58d9ad a baseline's profile started at 874.9 s of a 1.24B job on the 20 s it was
expected to take and the job ended at 900.8 s against the 900 s it then aimed at, the tuning run
at 906 s (same log)."""
PROFILE_COMPILED_S = 90.0
"""Expected seconds of one profile of a compiled config: the child compiles it again (Inductor's
disk cache warm; Dynamo and AOTAutograd run anew), 68 s at 0.4B, 122-130 s at 1.1B there, the
child's start and build included; at 1B on one H200 (bfdf330) 68 s without them (compile 51 s,
run 16 s, trace 1 s: `docs/benchmarks/raw/profile-child-h200-2026-11-29-bfdf330/`). A floor: a
config whose trials compiled longer is expected to take that compile and `PROFILE_EAGER_S` more
(`tuner.search.deciding.profiling.time_cut`; at the Qwen2-style shape on one H200, 2026-12-04,
144 s after a 105.6 s trial compile)."""
AUTO_PATIENCE = 4
"""The patience of a job on the default space on a GPU (the scale space too) given no --patience:
trials stop starting once this many complete trials in a row have not beaten the best by more than
the tie margin. On every preset of docs/benchmarks/peers-h100-2026-11-23-* the recommendation was
one of the four lever corners the search starts with (tuner.search.proposing.stages); the trials
after them moved the best by less than the run-to-run noise, at a compile each. Replayed on the
default job's recorded trials (docs/benchmarks/raw/default-job-h100-2026-11-24-warm/trials.json,
transformer small), 4 stops the cold job after trial 17, 168 s after its first trial began, with a
best 0.4 % below the 22 trials' (inside the 1 % tie margin), and the warm job after trial 16 at 93 s
with the same best; 8, the value until 2026-11-25, ran 197 s and 130 s for no gain outside the
margin (tests/tuner/search/test_search.py replays them)."""
CPU_SEARCH_BUDGET_S = 30.0
"""`python -m tuner run`'s search budget on a CPU when no --timeout is given
(`tuner.cli._cpu_defaults`)."""
CPU_FINAL_ROUNDS = 1
"""Its final rounds on a CPU when no --final-rounds is given."""
