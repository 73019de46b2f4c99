#!/usr/bin/env sh
# Makes DejaVuSans-Latin1.ttf, the font the plots are drawn with, from Debian's fonts-dejavu-core: DejaVu Sans
# cut down to Basic Latin + Latin-1 + a few punctuation marks, without hinting (about 20x smaller).
# Needs `pip install fonttools`.
set -eu
cd "$(dirname "$0")"
pyftsubset /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf \
  --unicodes="U+0020-007E,U+00A0-00FF,U+2013,U+2014,U+2019,U+2022,U+2026,U+2212" \
  --no-hinting --desubroutinize --layout-features='' --output-file=DejaVuSans-Latin1.ttf
