#!/usr/bin/env bash
# Sluice's JPEG decoding against simplejpeg (libjpeg-turbo) on the 128 coco128 train images, back to back on one
# machine. It runs the peer script first ($PEERS_DIR/m3_jpeg_decode.py: every image preloaded in RAM, one
# thread, PIL / cv2 / simplejpeg, full and 1/2 DCT-scaled decodes), then `sluice bench decode` for each case (the
# same images preloaded in RAM, then decoded by N threads), and prints sluice's images/s with the ratio
# sluice / peer (above 1: sluice is faster) against simplejpeg's full decode and its min_factor=2 reduced decode.
# Run it on a quiet machine: the peer waits for one (PEERS_MAX_WAIT_S), sluice does not.
#
# Usage: benches/decode_vs_peers.sh [case ...]      cases: full1 target640 target320 full2 (default: all four)
# Env:   PEERS_VENV       the peers' venv (default ~/.cache/sluice-peers/venv; made by $PEERS_DIR/setup.sh)
#        SLUICE_SHARED    the shared folder (default ../shared beside the repository; see benches/locations.sh)
#        PEERS_DIR        the peer scripts (default $SLUICE_SHARED/peers)
#        SLUICE_COCO128   coco128 (default $SLUICE_DATASETS/coco128, SLUICE_DATASETS default $SLUICE_SHARED/datasets)
#        SLUICE           a prebuilt `sluice` binary (default: `cargo build --release` of the package that
#                         holds it, then use it; with BACKEND=turbojpeg, built with --features turbojpeg)
#        BACKEND          sluice's decode backend: image (default; zune-jpeg) or turbojpeg
#        PEERS_REPEATS    timed passes of both sides (default 5, as the peer), after 1 untimed pass each
#        BENCH_OUT        where sluice's JSON, the peer log and the peer's results (PEERS_OUT) go
#                         (default $BENCH_SCRATCH/decode; the peers' results file is reset on every run)
#
# The cases and the peer figure each one is like-for-like with (marked * in the table; the other ratio is printed
# for reference). coco128's images are at most 640 px on the long side.
#   full1      --full, 1 thread: full-size RGB decode          * jpeg_decode.simplejpeg (full size, RGB)
#   target640  --imgsz 640, 1 thread: decode_to_target, the training loader's decode: no image is 1280 px or more,
#              so no DCT scaling; full decode, then the 500x375 ones resized to 640 (INTER_LINEAR). Sluice does at
#              least simplejpeg's full-size work      * jpeg_decode.simplejpeg
#   target320  --imgsz 320, 1 thread: decode_to_target at 320, against simplejpeg's 1/2 DCT-scaled decode. turbojpeg
#              decodes the 640 px images at 1/2 scale too (the three 500 px ones at full size, then resized); the
#              image backend has no DCT scaling (full decode, then INTER_LINEAR to 320), so it does more work than
#              that peer                                         * jpeg_decode.simplejpeg_min_factor2
#   full2      --full, 2 threads against the single-thread peer (the peers only measure one thread): the ratio is
#              sluice's 2-thread throughput over simplejpeg's 1-thread, not per-thread efficiency
#                                                                * jpeg_decode.simplejpeg
# Both sides count the same 128 images and the same source megapixels (checked and printed below).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
. "$ROOT/benches/locations.sh"
DATA=$SLUICE_COCO128/data.yaml
BACKEND=${BACKEND:-image}
REPEATS=${PEERS_REPEATS:-5}
OUT=${BENCH_OUT:-$BENCH_SCRATCH/decode}
CASES=${*:-full1 target640 target320 full2}
PY=$PEERS_VENV/bin/python

[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run $PEERS_DIR/setup.sh first" >&2; exit 1; }
[ -f "$PEERS_DIR/m3_jpeg_decode.py" ] || { echo "no peer scripts in $PEERS_DIR (set PEERS_DIR)" >&2; exit 1; }
[ -f "$DATA" ] || { echo "no $DATA (set SLUICE_COCO128 or SLUICE_DATASETS)" >&2; exit 1; }
for c in $CASES; do
  case $c in full1|target640|target320|full2) ;; *) echo "unknown case $c (full1 target640 target320 full2)" >&2; exit 1 ;; esac
done
case $BACKEND in image|turbojpeg) ;; *) echo "unknown BACKEND $BACKEND (image turbojpeg)" >&2; exit 1 ;; esac

# The peers' environment, as $PEERS_DIR/run_all.sh sets it.
export PEERS_REPEATS=$REPEATS
[ "$BACKEND" = turbojpeg ] && SLUICE_FEATURES=turbojpeg
. "$ROOT/benches/common.sh"

echo "== peer m3_jpeg_decode: python m3_jpeg_decode.py ($(date +%T), load $(load))"
if ! (cd "$PEERS_DIR" && "$PY" m3_jpeg_decode.py) > "$OUT/m3_jpeg_decode.log" 2>&1; then
  echo "!! peer m3_jpeg_decode failed, see $OUT/m3_jpeg_decode.log (its ratios print as nan)" >&2
  tail -5 "$OUT/m3_jpeg_decode.log" >&2
fi
grep -E '^(FIGURE|[0-9]+ images)' "$OUT/m3_jpeg_decode.log" || true

ours() {  # ours CASE args...: one `sluice bench decode --json` run into $OUT/CASE.json
  local c=$1; shift
  echo "== sluice $c: bench decode --backend $BACKEND $* ($(date +%T), load $(load))"
  "$SLUICE" bench decode --data "$DATA" --split train --backend "$BACKEND" --repeats "$REPEATS" --warmup 1 "$@" \
    --json > "$OUT/$c.json"
}

# One line per case: LABEL SLUICE_JSON LIKE_FOR_LIKE_PEER (full or min_factor2).
ROWS=$OUT/rows.tsv
: > "$ROWS"
row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$ROWS"; }

for c in $CASES; do
  case $c in
    full1)     ours full1 --full --threads 1;        row "full, 1 thread" full1.json full ;;
    target640) ours target640 --imgsz 640 --threads 1; row "to 640, 1 thread" target640.json full ;;
    target320) ours target320 --imgsz 320 --threads 1; row "to 320, 1 thread" target320.json min_factor2 ;;
    full2)     ours full2 --full --threads 2;        row "full, 2 threads (peer: 1)" full2.json full ;;
  esac
done

echo "==== sluice ($BACKEND) / simplejpeg (images/s; above 1: sluice is faster; * like-for-like; results in $OUT)"
"$PY" - "$OUT" "$PEERS_OUT" "$ROWS" <<'EOF'
import json, os, re, sys

out, peers_out, rows = sys.argv[1:4]
peer = {}
for line in open(peers_out):
    if line.strip():
        rec = json.loads(line)
        peer[rec["name"]] = rec  # the last figure of a name wins
nan = float("nan")
full = peer.get("jpeg_decode.simplejpeg.images_per_s", {})
half = peer.get("jpeg_decode.simplejpeg_min_factor2.images_per_s", {})
log = open(os.path.join(out, "m3_jpeg_decode.log")).read() if os.path.exists(os.path.join(out, "m3_jpeg_decode.log")) else ""
m = re.search(r"^(\d+) images, [\d.]+ MB of JPEG, ([\d.]+) source MP", log, re.M)
print(f"peer: {m.group(1)} images, {m.group(2)} source MP" if m else "peer: image count unknown (see its log)", end="")
print(f"; simplejpeg full {full.get('value', nan):.1f} img/s (contended {full.get('contended', '-')}), "
      f"min_factor2 {half.get('value', nan):.1f} img/s (contended {half.get('contended', '-')})")


def ratio(ours, p):
    return f"{ours / p:6.2f}" if p == p and p > 0 and ours == ours else "     -"


print(f"{'sluice':<28} {'img/s':>8} {'min..max':>15} {'/ full':>8} {'/ mf2':>8}")
for line in open(rows):
    label, json_name, like = line.rstrip("\n").split("\t")
    path = os.path.join(out, json_name)
    r = json.load(open(path)) if os.path.exists(path) else {}
    ours = r.get("images_per_s", nan)
    if m and r and (r["images"] != int(m.group(1)) or abs(r["source_mp"] - float(m.group(2))) > 1e-3):
        print(f"!! {label}: sluice decoded {r['images']} images, {r['source_mp']:.3f} MP: not the peer's set")
    spread = f"{r.get('images_per_s_min', nan):.0f}..{r.get('images_per_s_max', nan):.0f}"
    f_mark, h_mark = ("*", " ") if like == "full" else (" ", "*")
    print(f"{label:<28} {ours:8.1f} {spread:>15} {ratio(ours, full.get('value', nan))}{f_mark} "
          f"{ratio(ours, half.get('value', nan))}{h_mark}")
EOF
