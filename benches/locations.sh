# Sourced by the scripts in this folder right after they set ROOT: where the data outside the repository is, by the
# same variables and defaults as `sluice_testkit::locations`, and where scratch files go.
#   SLUICE_SHARED    the shared folder (default ../shared beside the repository)
#   SLUICE_DATASETS  datasets root (default $SLUICE_SHARED/datasets)
#   SLUICE_COCO128   coco128 (default $SLUICE_DATASETS/coco128)
#   SLUICE_FIXTURES  reference fixtures (default $SLUICE_SHARED/fixtures)
#   PEERS_DIR        the peers' scripts (default $SLUICE_SHARED/peers)
#   BENCH_SCRATCH    the benches' scratch root (default $CARGO_TARGET_DIR/bench-scratch, else target/bench-scratch
#                    in the repository)
SLUICE_SHARED=${SLUICE_SHARED:-$ROOT/../shared}
SLUICE_DATASETS=${SLUICE_DATASETS:-$SLUICE_SHARED/datasets}
SLUICE_COCO128=${SLUICE_COCO128:-$SLUICE_DATASETS/coco128}
SLUICE_FIXTURES=${SLUICE_FIXTURES:-$SLUICE_SHARED/fixtures}
PEERS_DIR=${PEERS_DIR:-$SLUICE_SHARED/peers}
BENCH_SCRATCH=${BENCH_SCRATCH:-${CARGO_TARGET_DIR:-$ROOT/target}/bench-scratch}
