#!/usr/bin/env bash
# The main job (README's first command, via `make run`): LeNet (d2l) on
# Fashion-MNIST, 10 epochs, batch 256, lr 0.2, with the metrics log and
# plot written to out/.
set -euo pipefail
bin=${1:-build/bin}
mkdir -p out
if [ -x "$bin/mgrun" ] && "$bin/mgtrain" --help | grep -q -- '--parallel'; then
    exec "$bin/mgrun" -n 2 "$bin/mgtrain" --model lenet-d2l --parallel ddp \
        --epochs 10 --batch 256 --lr 0.2 --log out/lenet-d2l.csv
fi
exec "$bin/mgtrain" --model lenet-d2l --epochs 10 --batch 256 --lr 0.2 --log out/lenet-d2l.csv
