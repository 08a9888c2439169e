# The kdrl service image: `kdrl serve`, the shipped ONNX model, no training stack (no torch)
# unless built with EXTRAS=train (the closed loop's CronJobs run that one, never the service).
#
#   docker build -t kdrl:0.1.0 .                                    # CPU: onnxruntime
#   docker build -t kdrl:0.1.0-cuda --build-arg RUNTIME=cuda .       # GPU nodes: onnxruntime-gpu
#   docker build -t kdrl:0.1.0-ray --build-arg EXTRAS=ray .          # knative/ray: plugin, head, workers
#   docker build -t kdrl:0.1.0-train --build-arg EXTRAS=train .      # knative/closed-loop's CronJobs
#
# The CUDA variant starts from NVIDIA's cuDNN runtime image (CUDA 12, what onnxruntime-gpu's
# PyPI wheels are built against); ONNX Runtime uses the GPU only when its session really runs
# there, and /readyz says which provider serves.
ARG RUNTIME=cpu

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY plugin plugin
COPY policies policies
COPY forecaster forecaster
COPY prewarm prewarm
COPY simulator simulator
# The wheel carries the model, the tuned weights, the cluster specs and the trace slice.
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim-bookworm AS runtime-cpu
ENV ORT_PACKAGE=onnxruntime

FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS runtime-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/bin/python3.12 /usr/local/bin/python3
ENV ORT_PACKAGE=onnxruntime-gpu

FROM runtime-${RUNTIME}
ARG EXTRAS=""
COPY --from=build /wheels /wheels
# One venv; the ONNX Runtime flavour is chosen here, whatever the platform marker would pick.
# KubeRay starts `ray` from a login shell, whose PATH is the system's: hence the link.
RUN python3 -m venv /opt/kdrl \
    && /opt/kdrl/bin/pip install --no-cache-dir "$(echo /wheels/*.whl)${EXTRAS:+[$EXTRAS]}" \
    && if [ -x /opt/kdrl/bin/ray ]; then ln -s /opt/kdrl/bin/ray /usr/local/bin/ray; fi \
    && /opt/kdrl/bin/pip uninstall -y onnxruntime onnxruntime-gpu \
    && /opt/kdrl/bin/pip install --no-cache-dir "${ORT_PACKAGE}>=1.20" \
    && rm -rf /wheels
ENV PATH=/opt/kdrl/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    NUMBA_CACHE_DIR=/tmp/numba \
    KDRL_HISTORY_PATH=/var/lib/kdrl/history.db
# Non-root, numeric (runAsNonRoot can verify it); the history lives on a mounted volume.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["kdrl", "serve"]
