"""Every tunable constant of fastspec, in one place (sizes, caps, thresholds), with why it has its value.

Caps on sizes the user controls are checked before any allocation (the error names the argument and the cap).
"""
from __future__ import annotations

# ---- kernels
#: vocabulary block of the two-level inverse-CDF sampler: block sums first, then a scan inside one block
BLOCK = 1024
#: token verification reads every row of a batch row ahead during its first weight passes when the row's logits
#: (all positions, target and draft) take at most this many bytes, so they stay cached until used; larger rows
#: read only the next position's rows ahead (the rest would be evicted and read twice).  Speed only: same results
READ_AHEAD_BYTES = 8 << 20

# ---- dumps
#: rows are read in chunks of at most this many bytes per array (peak extra memory is O(chunk))
DEFAULT_CHUNK_BYTES = 64 << 20
#: the largest chunk a caller may ask for (``max_bytes``): a chunk is mapped or decompressed at once, and nothing
#: is gained above a few hundred MiB, so a larger value is a mistake (e.g. 64 << 40 for 64 << 20)
MAX_CHUNK_BYTES = 1 << 34
#: absurd shapes, refused from the header: positions (N * T) per file (the α results alone take 8 bytes per
#: position and draft), and the last dimension of a role array (V or the top-k width; real vocabularies are
#: below 2**18, and one row must fit in one chunk)
MAX_POSITIONS = 1 << 32
MAX_WIDTH = 1 << 24
#: a deflated member declaring more than this ratio of its compressed size is treated as a zip bomb
MAX_DEFLATE_RATIO = 1000
#: Fortran-ordered members (and members that must be read whole) larger than this are refused
MAX_WHOLE_ARRAY_BYTES = 1 << 30
#: sparse rows: sum(exp(top-k logprobs)) may exceed 1 by this much (float16/32 rounding)
LOGPROB_SUM_TOLERANCE = 1e-3

# ---- cost tables (fastspec.costs)
#: a cost table is a few kilobytes of JSON; a file or a dump's ``costs`` array larger than this is refused unread
MAX_TABLE_BYTES = 1 << 20
#: every time in a table (forwards, overheads) lies in this range of seconds (standard errors in [0, max]): a
#: measured time is never zero (it would divide), and anything outside is a unit mistake whose squares and sums
#: could overflow a float
SECONDS_RANGE = (1e-9, 1e6)
#: the largest n (new tokens of a forward) or k a table may name (k <= 256 drafts x 64 candidates + 1 fits)
MAX_ENTRY_N = 1 << 20

# ---- n-gram proposers (fastspec.ngram)
#: the longest n-gram a proposer may match (a scan compares at most max_n tokens per position)
MAX_NGRAM = 1024
#: the most tokens one proposal may hold
MAX_PROPOSAL = 1 << 16

# ---- real-model runs (fastspec.hf and the dump, cost and measure commands, checked before torch is imported)
#: the longest continuation (``max_new_tokens``) and cost context (``context_length``): 2**20 tokens, hours of CPU
#: decoding and above the position limit of the models such a run is for, while an array sized by it stays
#: allocatable (10**12 would ask for terabytes before the position check could run)
MAX_NEW_TOKENS = 1 << 20
#: timing rounds (``--repeats``, ``--cost-repeats``) and discarded warm-up rounds (``--warmup``): run-time guards
MAX_REPEATS = 1000
MAX_WARMUP = 100
#: warm-up rounds of a cost measurement (fastspec.hf.measure_costs) when none are given
DEFAULT_WARMUP = 2

# ---- analysis and simulation
#: largest draft length k anywhere (simulate, inspect, the DP, the real loop)
MAX_K = 256
#: Monte-Carlo replays per sequence (also block-verification replays).  At least 2: the interval needs two
#: batches.  The cap bounds run time, not memory: every replay keeps its scratch O(chunk) whatever the count.
MIN_TRIALS, MAX_TRIALS = 2, 10 ** 7
#: token mode: 20 trials (20 batches of one) give the agreement checks 19 degrees of freedom, enough to flag a
#: replay that under-accepts by 3% on the 12 sequences of data/synthetic_pair.npz (tests/test_simulate_check.py)
DEFAULT_TRIALS = {"bernoulli": 200, "token": 20}
#: batch means: trials are split into this many independent batches for the Monte-Carlo interval (at most
#: MAX_BATCHES: the Bernoulli replay keeps counters per batch and row)
DEFAULT_BATCHES = 20
MAX_BATCHES = 1000
#: false-alarm probability of each Monte-Carlo agreement check (two-sided): |MC - exact| / standard error is
#: judged against Student's t with batches - 1 degrees of freedom, the token-mode acceptance check against the
#: normal, at this probability (see fastspec.simulate)
AGREEMENT_FALSE_ALARM = 1e-4
#: Bernoulli replay scratch counters per block of rows, and position-trials per block (a progress tick each)
REPLAY_SCRATCH_BYTES = 32 << 20
REPLAY_BLOCK_WORK = 1 << 26
#: token-mode replay: rows per verify call, bytes of logits gathered per chunk of sequences, and (sequence,
#: trial) replays advanced in lockstep at a time (scratch is O(lanes), whatever the number of trials)
TOKEN_REPLAY_ROWS = 64
TOKEN_REPLAY_CHUNK_BYTES = 64 << 20
TOKEN_REPLAY_LANES = 1 << 15
#: candidates per drafted position in the simulator
MAX_CANDIDATES = 64
#: block-verification replays per sequence (default)
DEFAULT_BLOCK_TRIALS = 10
