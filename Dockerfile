# CPU image: installs lmtrain and trains the default model (PTB, full softmax).
#   docker build -t lmtrain .
#   docker run --rm -v $PWD/data:/app/data -v $PWD/outputs:/app/outputs lmtrain [overrides...]
# GPU variant: start FROM pytorch/pytorch:2.*-cuda12*-runtime (or nvidia/cuda + pip install torch with CUDA)
# and skip the CPU torch line below; the code runs unchanged on CUDA (trainer.accelerator=auto).
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY lmtrain ./lmtrain
COPY scripts ./scripts
RUN pip install --no-cache-dir -e .
ENV WANDB_MODE=offline
ENTRYPOINT ["python", "-m", "lmtrain"]
