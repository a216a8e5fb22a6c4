#!/usr/bin/env bash
# End-to-end tests of the qvattn CLI: its JSON output, its table output and
# its error paths (each bad input must exit non-zero with a message on stderr
# that names the problem).  Run by CTest from the repository root as
#   bash tests/cli_test.sh path/to/qvattn
# Input files are made with python3's struct/json only (no numpy in CI).
set -u

BIN=${1:?usage: cli_test.sh path/to/qvattn}
T=$(mktemp -d /tmp/qvattn-cli-XXXXXX) || exit 1
trap 'rm -rf "$T"' EXIT
FAILS=0
COUNT=0

ok() { COUNT=$((COUNT + 1)); echo "ok   $1"; }
bad() {
    COUNT=$((COUNT + 1)); FAILS=$((FAILS + 1)); echo "FAIL $1"
    sed 's/^/     stderr: /' "$T/err" | head -5
}

# run ARGS...: stdout -> $T/out, stderr -> $T/err, status -> RC.  With
# LIMIT=S set (LIMIT=S expect_err ...), a run past S seconds is killed
# (status 124): for inputs that used to make the tool run forever.
run() { ${LIMIT:+timeout "$LIMIT"} "$BIN" "$@" >"$T/out" 2>"$T/err"; RC=$?; }

# expect_ok NAME ARGS...
expect_ok() {
    local name=$1; shift
    run "$@"
    if [ "$RC" -eq 0 ]; then ok "$name"; else bad "$name (exit $RC)"; fi
}

# expect_err NAME CODE PATTERN ARGS...: exit CODE (or any non-zero if CODE
# is "any"), and stderr matches PATTERN (grep -E, case-insensitive).
expect_err() {
    local name=$1 code=$2 pat=$3; shift 3
    run "$@"
    if [ "$RC" -eq 0 ]; then bad "$name: exit 0, expected failure"; return; fi
    if [ "$code" != any ] && [ "$RC" -ne "$code" ]; then
        bad "$name: exit $RC, expected $code"; return
    fi
    if ! grep -qiE -- "$pat" "$T/err"; then bad "$name: stderr lacks /$pat/"; return; fi
    if [ -s "$T/out" ]; then bad "$name: wrote to stdout on failure"; return; fi
    ok "$name"
}

# check_json NAME PYTHON: runs PYTHON with d = json.load(stdout of last run)
check_json() {
    local name=$1 code=$2
    if [ "$RC" -ne 0 ]; then bad "$name (exit $RC)"; return; fi
    if python3 -c "import json, math, sys
def strict(c): raise ValueError('non-standard JSON constant ' + c)
d = json.load(open(sys.argv[1]), parse_constant=strict)
$code" "$T/out" 2>"$T/err"; then ok "$name"; else bad "$name"; fi
}

# ---------------------------------------------------------------- files
# gen.py CASE PATH: writes a valid or broken input file.
cat >"$T/gen.py" <<'EOF'
import json, math, random, struct, sys

def values(n, seed):
    r = random.Random(seed)
    return [r.gauss(0.0, 1.0) for _ in range(n)]

def pack(dtype, xs):
    if dtype == "F32":
        return struct.pack("<%df" % len(xs), *xs)
    if dtype == "F16":
        return struct.pack("<%de" % len(xs), *xs)
    if dtype == "BF16":  # truncate f32 to its top half: fine for test data
        raw = struct.pack("<%df" % len(xs), *xs)
        return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    raise ValueError(dtype)

def safetensors(path, shapes, dtype="F32", drop=None, nan=False, cut=0,
                header=None):
    hdr, data = {"__metadata__": {"made_by": "cli_test"}}, b""
    for i, name in enumerate("qkv"):
        if name == drop:
            continue
        shape = shapes[name] if isinstance(shapes, dict) else shapes
        n = math.prod(shape)
        xs = values(n, i)
        if nan and name == "v" and n:
            xs[n // 2] = float("nan")
        blob = pack(dtype, xs)
        hdr[name] = {"dtype": dtype, "shape": shape,
                     "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = header if header is not None else json.dumps(hdr)
    raw = text.encode()
    out = struct.pack("<Q", len(raw)) + raw + data
    with open(path, "wb") as f:
        f.write(out[:len(out) - cut] if cut else out)

def npy(path, shape, seed):
    d = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else ""))
    d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode())
        f.write(pack("F32", values(math.prod(shape), seed)))

case, path = sys.argv[1], sys.argv[2]
ok = [2, 128, 64]
if case == "ok":        safetensors(path, ok)
elif case == "ok-bf16": safetensors(path, [1, 2, 128, 64], dtype="BF16")
elif case == "ok-npy":
    for i, n in enumerate("qkv"):
        npy("%s/%s.npy" % (path, n), ok, i)
elif case == "trunc":   safetensors(path, ok, cut=1000)
elif case == "nan":     safetensors(path, ok, nan=True)
elif case == "n0":      safetensors(path, [2, 0, 64])
elif case == "d96":     safetensors(path, [2, 128, 96])
elif case == "nok":     safetensors(path, ok, drop="k")
elif case == "badjson": safetensors(path, ok, header='{"q": [1, 2')
elif case == "kvdiff":  safetensors(path, {"q": ok, "k": ok, "v": [2, 64, 64]})
else: raise SystemExit("unknown case " + case)
EOF

gen() { python3 "$T/gen.py" "$1" "$2" || { echo "gen.py $1 failed"; exit 1; }; }
gen ok "$T/ok.safetensors"
gen ok-bf16 "$T/ok-bf16.safetensors"
mkdir -p "$T/npydir" && gen ok-npy "$T/npydir"
for c in trunc nan n0 d96 nok badjson kvdiff; do gen "$c" "$T/$c.safetensors"; done

# ---------------------------------------------------------------- info
expect_ok "info" info
grep -q "qvattn 0.1" "$T/out" && grep -q "vc8+expcast" "$T/out" \
    && ok "info lists version and methods" || bad "info content"
run info --json
check_json "info --json" '
assert d["backends"]["cpu"] is True
assert d["methods"]["exact"]["cpu_d64"]["ok"] is True'
expect_ok "--help" --help
expect_ok "eval --help" eval --help
grep -q -- "--query-sample" "$T/out" && ok "eval --help content" || bad "eval --help content"
for c in bench info sweep-vsmooth; do expect_ok "$c --help" "$c" --help; done

# ---------------------------------------------------------------- eval
DEFAULTS="exact bf16 fp8 sage8 vc8+expcast-centred+pblock vc8 vc8+expcast vc8+expcast-centred vc8+nohadamard vc8+nohadamard+expcast sage8+nohadamard+fp32sum vc8+i8pv draft@85/0/0/15 draft@85/0/7.5/7.5"
run eval --synthetic tiny --json
# On tiny (one 128-token region) draft@ may skip the only region pair, so
# its rows can be empty (output 0, rel-L2 exactly 1, DA2 B.4): draft is
# held to < 1 on the 'small' preset below instead.
check_json "eval tiny --json: every default method, finite" "
names = '$DEFAULTS'.split()
m = d['methods']
assert sorted(m) == sorted(names), sorted(m)
for k in names:
    r = m[k]['rel_l2']
    assert r is not None and math.isfinite(r), (k, r)
    assert r < 1 or (k.startswith('draft') and r <= 1 + 1e-6), (k, r)
    assert m[k]['device'] in ('cpu', 'cuda'), k
    assert m[k]['ms'] >= 0, k
assert m['exact']['rel_l2'] == 0 and m['exact']['cos_sim'] == 1
assert m['bf16']['rel_l2'] < 0.02 and m['bf16']['psnr'] > 40
i = d['input']
assert (i['B'], i['H'], i['N'], i['D']) == (1, 2, 128, 64), i
assert i['grid'] == [2, 8, 8] and i['prefix'] == 0, i
for order in ('sequence', 'kmeans', 'hadamard'):
    assert 0 <= d['vquant'][order]['rel_mse'] < 1, order
assert 0 <= d['expcast_tv']['mean'] <= d['expcast_tv']['max'] <= 1"

run eval --synthetic small --methods draft@85/0/0/15,draft@85/0/7.5/7.5,sage8 --json
check_json "eval small draft --json: rel-L2 < 1" "
for k, v in d['methods'].items():
    assert 0 < v['rel_l2'] < 1, (k, v)"

# The adaptive budget reports the share each head kept (JSON and table).
run eval --synthetic small --methods draft@85/0/0/15,draft@p90/0/50/50 --json
check_json "eval small adaptive draft --json: kept_share" "
f, a = d['methods']['draft@85/0/0/15'], d['methods']['draft@p90/0/50/50']
assert f['kept_share']['min'] == f['kept_share']['max'] and abs(f['kept_share']['min'] - 5 / 36) < 1e-8, f
k = a['kept_share']
assert 0 < k['min'] <= k['mean'] <= k['max'] <= 1 and k['pairs'] == 36, k
assert a['canonical'] == 'draft@p90/0/50/50' and a['rel_l2'] < f['rel_l2'], a"
# --dtype: the library is given 16-bit q, k, v (rounded to nearest even);
# exact then runs on the rounded values, so bf16's error leaves out the
# input rounding that it counts with f32 inputs.
run eval --synthetic tiny --methods exact,bf16 --json
cp "$T/out" "$T/f32.json"
run eval --synthetic tiny --methods exact,bf16 --dtype bf16 --json
check_json "eval --dtype bf16 --json" "
f = json.load(open('$T/f32.json'))
assert d['input']['dtype'] == 'bf16' and f['input']['dtype'] == 'f32'
assert d['methods']['exact']['rel_l2'] == 0
assert 0 < d['methods']['bf16']['rel_l2'] < f['methods']['bf16']['rel_l2'], (d['methods']['bf16'], f['methods']['bf16'])"
expect_ok "bench --dtype f16" bench --shape 1,1,128,64 --methods bf16 --iters 1 --dtype f16
grep -q "D=64 f16" "$T/out" && ok "bench --dtype f16 table" || bad "bench --dtype f16 table"
expect_err "eval --dtype unknown" 2 "f32, bf16 or f16" eval --synthetic tiny --dtype f8
expect_ok "eval adaptive table" eval --synthetic small --methods draft@p95 --device cpu
grep -q "draft kept share" "$T/out" && grep -q "^  draft@p95 " "$T/out" \
    && ok "eval kept share table" || bad "eval kept share table"

expect_ok "eval table" eval --synthetic tiny --methods exact,bf16,sage8
grep -q "PSNR" "$T/out" && grep -q "^bf16 " "$T/out" && grep -q "V quantization" "$T/out" \
    && grep -q "ExpCast TV" "$T/out" && ok "eval table content" || bad "eval table content"
# a name longer than the column's minimum still leaves every row's device
# column where the header's is
expect_ok "eval table, long name" eval --synthetic tiny --methods exact,vc8+expcast-centred+pblock
hdr=$(grep "^method " "$T/out" | head -1 | awk '{print index($0, " device ")}')
rows=$(grep -E "^(exact|vc8\+expcast-centred\+pblock) " "$T/out" | awk '{print index($0, " cpu ")}' | sort -u)
[ -n "$hdr" ] && [ "$hdr" -gt 1 ] && [ "$rows" = "$hdr" ] && ok "eval table columns line up" \
    || bad "eval table columns line up (header $hdr, rows $rows)"

run eval --synthetic tiny --heads 1 --query-sample 32 --methods exact,bf16,vc8 --json
check_json "eval --heads --query-sample" "
i = d['input']
assert i['H'] == 1 and i['heads_total'] == 2 and i['query_rows'] == 32, i
assert d['methods']['bf16']['rel_l2'] < 0.02
assert 'skipped' in d['methods']['vc8']"

run eval --synthetic tiny --decompose --methods exact,sage8,vc8+expcast --json
check_json "eval --decompose --json: terms, skips, dominant" "
t = d['decompose']
assert sorted(t) == ['exact', 'sage8', 'vc8+expcast'], sorted(t)
assert 'nothing' in t['exact']['skipped'], t['exact']
for k in ('sage8', 'vc8+expcast'):
    r = t[k]
    assert abs(r['full'] - d['methods'][k]['rel_l2']) < 1e-12 or d['methods'][k]['device'] == 'cuda', (k, r)
    assert all(0 < r[n] <= r['full'] for n in ('q', 'k', 'p', 'v')), r
    assert r['none'] < 1e-5 and r['dominant'] in ('q', 'k', 'p', 'v', 'mu'), r
assert t['sage8']['mu'] is None and t['vc8+expcast']['mu'] > 0"
expect_ok "eval --decompose table" eval --synthetic tiny --decompose --methods bf16,sage8
grep -q "Where the error comes from" "$T/out" && grep -q "^dominant: sage8: " "$T/out" \
    && grep -q "^bf16 .*skipped: bf16 rounds" "$T/out" && ok "eval --decompose table content" \
    || bad "eval --decompose table content"
run eval --synthetic tiny --query-sample 32 --decompose --methods vc8,sage8 --json
check_json "eval --decompose under --query-sample skips vc8" "
assert 'skipped' in d['decompose']['vc8'] and d['decompose']['sage8']['full'] > 0"

run eval --synthetic tiny --draft-report --draft-sweep 0,50,100 --device cpu \
    --methods bf16,draft@85/0/0/15,draft@50/0/25/25 --json
check_json "eval --draft-report --draft-sweep --json" "
r = d['draft_report']
assert sorted(r) == ['draft@50/0/25/25', 'draft@85/0/0/15'], sorted(r)
for name, x in r.items():
    s = x['summary']
    assert s['heads'] == 2 and len(x['heads']) == 2 and s['regions'] == 2, s
    assert abs(s['rel_l2'] - d['methods'][name]['rel_l2']) <= 1e-12 * s['rel_l2'], (s, name)
    for h in x['heads']:
        assert 0 <= h['router_mass'] <= h['oracle_mass'] <= 1 + 1e-12, h
        assert abs(h['mass16'] + h['mass8'] + h['mass4'] + h['prefix_mass'] - h['router_mass']) < 1e-12
assert r['draft@50/0/25/25']['heads'][0]['kept8'] == 1
p = d['draft_sweep']
assert p['method'] == 'draft@85/0/0/15' and [x['skip'] for x in p['points']] == [0, 0.5, 1], p
assert abs(p['points'][0]['router_mass'] - 1) < 1e-12 and p['points'][2]['kept_share'] == 0, p"
expect_ok "eval --draft-report table" eval --synthetic tiny --draft-report --draft-sweep 50,85 \
    --device cpu --methods draft@85/0/0/15
grep -q "^Route quality" "$T/out" && grep -q "^summary: draft@85/0/0/15: kept" "$T/out" \
    && grep -q "^Skip-rate sweep, draft@85/0/0/15" "$T/out" && ok "eval --draft-report table content" \
    || bad "eval --draft-report table content"
run eval --synthetic tiny --query-sample 32 --draft-report --methods draft@85/0/0/15 --json
check_json "eval --draft-report under --query-sample skips" "
assert 'skipped' in d['draft_report']['draft@85/0/0/15']"
expect_err "eval --draft-sweep not a number" 2 "not a percentage" eval --synthetic tiny --draft-sweep 50,x
expect_err "eval --draft-sweep out of range" 2 "outside \\[0, 100\\]" eval --synthetic tiny --draft-sweep 120
expect_err "eval --draft-sweep without a draft method" 2 "needs a draft@ method" \
    eval --synthetic tiny --methods bf16 --draft-sweep 50

run eval --input "$T/ok.safetensors" --methods exact,bf16,sage8 --json
check_json "eval safetensors input" "
assert d['input']['format'] == 'safetensors' and d['input']['N'] == 128
assert d['methods']['sage8']['rel_l2'] < 0.1"
run eval --input "$T/ok-bf16.safetensors" --grid 2,8,8 --methods bf16,draft@50/0/0/50 --json
check_json "eval bf16 file with --grid and draft" "
assert d['input']['grid'] == [2, 8, 8]
assert d['methods']['draft@50/0/0/50']['rel_l2'] < 1"
run eval --input "$T/npydir" --methods bf16 --json
check_json "eval npy directory" "assert d['input']['format'] == 'npy'"
run eval --input "$T/npydir/q.npy,$T/npydir/k.npy,$T/npydir/v.npy" --methods bf16 --json
check_json "eval npy list" "assert d['methods']['bf16']['rel_l2'] < 0.02"
run eval --input "$T/ok.safetensors" --json --methods exact,bf16
check_json "eval file, default draft without grid is fine" "assert len(d['methods']) == 2"
run eval --input "$T/ok.safetensors" --json
check_json "eval file, default list skips draft without --grid" "
assert 'skipped' in d['methods']['draft@85/0/0/15']"

# ---------------------------------------------------------------- bench, sweep
run bench --device cpu --synthetic tiny --iters 2 --methods bf16,sage8 --json
check_json "bench --json" "
for k in ('bf16', 'sage8'):
    assert d['methods'][k]['ms'] > 0 and d['methods'][k]['tops'] > 0, k
assert d['iters'] == 2 and 'reference' in d['note']"
expect_ok "bench --shape table" bench --device cpu --shape 1,1,256,64 --iters 1 --methods bf16
grep -q "TOPS" "$T/out" && grep -q "not product speed" "$T/out" \
    && ok "bench table content" || bad "bench table content"
run sweep-vsmooth --synthetic small --clusters 4,8 --iters 1,2 --json
check_json "sweep-vsmooth --json" "
assert len(d['sweep']) == 4
assert {(r['clusters'], r['iters']) for r in d['sweep']} == {(4,1),(4,2),(8,1),(8,2)}
for r in d['sweep'] + [d['sequence']]:
    assert 0 < r['rel_mse'] < 1 and 0 <= r['energy_share'] <= 1, r"
expect_ok "sweep-vsmooth table" sweep-vsmooth --synthetic tiny --clusters 2 --iters 1

# ---------------------------------------------------------------- errors
expect_err "unknown method" 2 "unknown method 'foo'" eval --synthetic tiny --methods bf16,foo
expect_err "duplicate method" 2 "bf16 listed twice" eval --synthetic tiny --methods bf16,sage8,bf16
expect_err "unknown preset" 2 "unknown synthetic preset 'nope'" eval --synthetic nope
expect_err "missing file" 1 "cannot open" eval --input "$T/does-not-exist.safetensors"
expect_err "truncated file" 1 "truncated" eval --input "$T/trunc.safetensors"
expect_err "NaN in the data" 1 "NaN" eval --input "$T/nan.safetensors"
expect_err "N = 0" 1 "N = 0" eval --input "$T/n0.safetensors"
expect_err "D = 96" 1 "head dim D=96 not supported: 64 or 128" eval --input "$T/d96.safetensors"
expect_err "missing k" 1 "no tensor named 'k'" eval --input "$T/nok.safetensors"
expect_err "bad JSON header" 1 "header JSON" eval --input "$T/badjson.safetensors"
expect_err "k/v shapes differ" 1 "different shapes" eval --input "$T/kvdiff.safetensors"
expect_err "absurd grid" 2 "T\*H\*W\+P = 1000000000 tokens.*N=128" \
    eval --synthetic tiny --grid 1000,1000,1000
expect_err "grid without prefix mismatch" 2 "N=128.*missing --prefix" \
    eval --input "$T/ok.safetensors" --grid 2,8,7 --methods bf16
expect_err "draft without grid" 2 "needs the video layout" \
    eval --input "$T/ok.safetensors" --methods draft@85/0/0/15
expect_err "bad --heads" 2 "--heads 5: the input has H=2" eval --synthetic tiny --heads 5
expect_err "non-integer --heads" 2 "expects an integer" eval --synthetic tiny --heads two
expect_err "bad --query-sample" 2 "--query-sample 0" eval --synthetic tiny --query-sample 0
expect_err "unknown flag" 2 "unknown option '--bogus'" eval --bogus
expect_err "flag of another command" 2 "unknown option '--shape'" eval --shape 1,1,128,64
expect_err "missing value" 2 "--methods needs a value" eval --methods
expect_err "unknown command" 2 "unknown command 'frobnicate'" frobnicate
expect_err "bad --device" 2 "--device must be" eval --device tpu
expect_err "step outside steps" 2 "--step 5 is outside --steps 2" eval --synthetic tiny --step 5 --steps 2
expect_err "two inputs" 2 "only one of" eval --synthetic tiny --input "$T/ok.safetensors"
expect_err "bench bad shape" 2 "head dim D=96" bench --shape 1,1,128,96
expect_err "sweep too many clusters" 2 "more clusters than" sweep-vsmooth --synthetic tiny --clusters 1000

# ---------------------------------------------------------------- hostile numbers (issue 13)
# T*H*W used to wrap: 8*1263665316*1824726041 = 32 (mod 2^64), + 96 = N.
expect_err "grid product overflow" 2 "8x1263665316x1824726041 \+ prefix 96: T\*H\*W\+P overflows int64.*N=128" \
    eval --synthetic tiny --grid 8,1263665316,1824726041 --prefix 96 --methods bf16
expect_err "grid larger than N" 2 "T\*H\*W\+P = 3458764513820540928 tokens.*N=128" \
    eval --synthetic tiny --grid 3,1073741824,1073741824 --methods bf16
expect_err "grid entry past int" 2 "--grid: 4294967296 is outside \[1, 2147483647\]" \
    eval --synthetic tiny --grid 2,8,4294967296
expect_err "hex draft quota" 2 "draft quota 1 '0x55' is not a plain decimal" \
    eval --synthetic tiny --methods draft@0x55/0/0/15
expect_err "blank in draft quota" 2 "draft quota 1 ' 85' is not a plain decimal" \
    eval --synthetic tiny --methods "draft@ 85/0/0/15"
expect_err "draft mass of zero" 2 "draft mass p0 is outside \(0,100\]" \
    eval --synthetic tiny --methods draft@p0
expect_err "draft mass split" 2 "draft split 0/50/60 .* does not sum to 100" \
    eval --synthetic tiny --methods draft@p95/0/50/60
expect_err "option given twice" 2 "'\+expcast' given twice" \
    eval --synthetic tiny --methods vc8+expcast+expcast
expect_err "seed past 2^64" 2 "--seed 99999999999999999999999 is out of range" \
    eval --synthetic tiny --seed 99999999999999999999999 --methods bf16
expect_err "signed seed" 2 "--seed expects a non-negative integer" \
    eval --synthetic tiny --seed +5 --methods bf16
expect_ok "seed 2^64-1" eval --synthetic tiny --seed 18446744073709551615 --methods bf16
expect_ok "hex seed" eval --synthetic tiny --seed 0xFFFFFFFFFFFFFFFF --methods bf16
expect_err "int option past int" 2 "--layer 99999999999 does not fit an int" \
    eval --synthetic tiny --layer 99999999999
expect_err "int option with a sign" 2 "--heads expects an integer, got '\+1'" \
    eval --synthetic tiny --heads +1
expect_err "int option with a blank" 2 "--step expects an integer" \
    eval --synthetic tiny --step " 1"
LIMIT=60 expect_err "sweep-vsmooth --iters INT_MAX" 2 "--iters: 2147483647 is outside \[1, 1000\]" \
    sweep-vsmooth --synthetic tiny --clusters 2 --iters 2147483647
expect_err "sweep-vsmooth --clusters past the cap" 2 "--clusters: 5000 is outside \[1, 4096\]" \
    sweep-vsmooth --synthetic tiny --clusters 5000 --iters 1
LIMIT=60 expect_err "bench --iters INT_MAX" 2 "--iters 2147483647 is outside \[1, 100000\]" \
    bench --device cpu --synthetic tiny --methods bf16 --iters 2147483647
# (num_steps + 3) / 4 overflowed at INT_MAX (UBSan); the window is 2^29.
run eval --device cpu --synthetic tiny --methods vc8 --steps 2147483647 --step 2147483646 --json
check_json "vc8 at step INT_MAX-1 of INT_MAX" "assert d['methods']['vc8']['rel_l2'] < 0.1"

run
if [ "$RC" -eq 2 ] && grep -q "usage" "$T/err"; then ok "no command"; else bad "no command"; fi

echo "cli_test: $COUNT checks, $FAILS failures"
[ "$FAILS" -eq 0 ]
