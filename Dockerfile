# CPU image: installs lmtrain and trains (default: PTB, full softmax). It runs as the unprivileged user lmtrain
# (uid 1000), never as root. Mount the folders it writes, or a run's outputs vanish with the container:
#   docker build -t lmtrain .
#   mkdir -p outputs data     # create the mount points yourself: Docker would create them owned by root
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/outputs:/app/outputs" -v "$PWD/data:/app/data" \
#       lmtrain data=synthetic
# --user "$(id -u):$(id -g)" runs it as you: it can write to your folders and what it writes is yours; without it
# the mounted folders must be writable by uid 1000. The tools of a trained run:
#   docker run --rm --user "$(id -u):$(id -g)" -v "$PWD/outputs:/app/outputs" -v "$PWD/data:/app/data" \
#       --entrypoint python lmtrain -m lmtrain.generate ckpt_path=outputs/DATE/TIME prompt="the company said"
# GPU variant: start FROM pytorch/pytorch:2.*-cuda12*-runtime (or nvidia/cuda + pip install torch with CUDA)
# and skip the CPU torch line below; the code runs unchanged on CUDA (trainer.accelerator=auto, device=auto).
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY lmtrain ./lmtrain
COPY conf ./conf
COPY hydra_plugins ./hydra_plugins
COPY scripts ./scripts
# a non-editable install: the Hydra config tree conf/ ships inside the package as lmtrain/conf; outputs/, multirun/
# and data/ are the mount points, and HOME (W&B settings, the Hugging Face download cache) is writable by any uid
# that --user picks
RUN pip install --no-cache-dir . \
    && rm -rf build lmtrain.egg-info \
    && useradd --create-home --uid 1000 lmtrain \
    && mkdir -p outputs multirun data \
    && chown lmtrain: outputs multirun data \
    && chmod 1777 outputs multirun data /home/lmtrain
ENV WANDB_MODE=offline HOME=/home/lmtrain PYTHONDONTWRITEBYTECODE=1
USER lmtrain
ENTRYPOINT ["python", "-m", "lmtrain"]
