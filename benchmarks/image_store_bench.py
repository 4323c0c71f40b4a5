"""Image storage: KB per image and quality per codec and encoder, encode and decode ms per image.

    python benchmarks/image_store_bench.py [--images 16] [--crops 8] [--workers 1 2]

Images are synthetic and photo-like (benchmarks/photo_like.py: no real photos here), stored at
short side 512 through the writer's own preparation (Lanczos-3). Quality is the PSNR of 256 x 256
random resized crops (area 0.2-1, ratio 3/4-4/3, area-filtered) of the decoded image against the
same crop of the stored-size original. Each family is swept over its quality setting and
interpolated (log size against PSNR) to the same quality, as in a rate-distortion comparison.
Encode and decode times are single-threaded, per image at the stored size. Finally the writer's
throughput (``write_images``) on 1 and N worker threads shows how far encoding scales.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
import simplejpeg
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from photo_like import photo_like

from kohakuclip.write.image_codecs import encode_pixels
from kohakuclip.write.image_prepare import prepare


@dataclass(frozen=True)
class Family:
    name: str
    encode: Callable[[np.ndarray, int], bytes]
    decode: Callable[[bytes], np.ndarray]
    qualities: tuple[int, ...]


def _pillow_decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _av1_decode(data: bytes) -> np.ndarray:
    import av

    decoder = av.CodecContext.create("libdav1d", "r")
    frame = (decoder.decode(av.Packet(data)) + decoder.decode(None))[0]
    return frame.reformat(
        format="rgb24", src_colorspace="ITU601", src_color_range="JPEG", dst_color_range="JPEG"
    ).to_ndarray()


def _roundtrip_420(pixels: np.ndarray) -> np.ndarray:
    import av

    frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(
        format="yuv420p", dst_colorspace="ITU601", dst_color_range="JPEG"
    )
    return frame.reformat(
        format="rgb24", src_colorspace="ITU601", src_color_range="JPEG", dst_color_range="JPEG"
    ).to_ndarray()


def _turbo_optimized(pixels: np.ndarray, q: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=q, subsampling=0, optimize=True)
    return out.getvalue()


def _families() -> list[Family]:
    jpeg_q = (50, 60, 70, 80, 90)
    out = [
        Family(
            "JPEG 4:4:4 tuned (default)",
            lambda p, q: encode_pixels(p, "jpeg", q, "tuned").data,
            simplejpeg.decode_jpeg,
            jpeg_q,
        ),
        Family(
            "JPEG 4:4:4 libjpeg-turbo (turbo)",
            lambda p, q: encode_pixels(p, "jpeg", q, "turbo").data,
            simplejpeg.decode_jpeg,
            jpeg_q,
        ),
        Family(
            "JPEG 4:4:4 libjpeg-turbo + optimized Huffman",
            _turbo_optimized,
            simplejpeg.decode_jpeg,
            jpeg_q,
        ),
        Family(
            "JPEG 4:2:0 libjpeg-turbo",
            lambda p, q: simplejpeg.encode_jpeg(p, q, colorsubsampling="420"),
            simplejpeg.decode_jpeg,
            jpeg_q,
        ),
    ]
    try:
        import pyjpegli  # noqa: F401

        out.append(
            Family(
                "JPEG 4:2:0 jpegli (pyjpegli)",
                lambda p, q: encode_pixels(p, "jpeg", q, "jpegli").data,
                simplejpeg.decode_jpeg,
                (60, 70, 80, 90, 95),
            )
        )
    except ImportError:
        print("jpegli: unavailable (pip install pyjpegli)")
    out.append(
        Family(
            "AVIF 4:2:0 SVT-AV1 preset 8, tune iq",
            lambda p, q: encode_pixels(p, "avif", q).data,
            _av1_decode,
            (30, 40, 50, 60, 70, 80),
        )
    )
    out.append(
        Family(
            "WebP method 6",
            lambda p, q: encode_pixels(p, "webp", q).data,
            _pillow_decode,
            (50, 60, 70, 80, 90, 95),
        )
    )
    try:
        import pillow_jxl  # noqa: F401

        out.append(
            Family(
                "JPEG XL effort 7, decoding speed 4",
                lambda p, q: encode_pixels(p, "jxl", q).data,
                _pillow_decode,
                (50, 60, 70, 80, 90, 95),
            )
        )
    except ImportError:
        print("JPEG XL: unavailable (pip install pillow-jxl-plugin)")
    return out


def _crops(shape: tuple[int, ...], n: int, seed: int) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(seed)
    h, w = shape[:2]
    out = []
    for _ in range(n):
        area = rng.uniform(0.2, 1.0) * h * w
        ratio = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        cw = int(min(w, round(np.sqrt(area * ratio))))
        ch = int(min(h, round(np.sqrt(area / ratio))))
        out.append((int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw))
    return out


def _crop_psnr(ref: np.ndarray, test: np.ndarray, crops: list[tuple[int, int, int, int]]) -> float:
    values = []
    for y, x, h, w in crops:
        a = cv2.resize(ref[y : y + h, x : x + w], (256, 256), interpolation=cv2.INTER_AREA)
        b = cv2.resize(test[y : y + h, x : x + w], (256, 256), interpolation=cv2.INTER_AREA)
        mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
        values.append(10 * np.log10(255.0**2 / max(mse, 1e-10)))
    return float(np.mean(values))


def _sweep(
    family: Family, images: list[np.ndarray], crops: list[list[tuple[int, int, int, int]]]
) -> list[tuple[int, float, float, float, float]]:
    """(quality, KB / image, crop PSNR, encode ms, decode ms) per quality setting."""
    rows = []
    for q in family.qualities:
        size, psnrs, enc_s, dec_s = 0, [], 0.0, 0.0
        for px, cs in zip(images, crops):
            t0 = time.perf_counter()
            data = family.encode(px, q)
            t1 = time.perf_counter()
            decoded = family.decode(data)
            t2 = time.perf_counter()
            enc_s += t1 - t0
            dec_s += t2 - t1
            size += len(data)
            psnrs.append(_crop_psnr(px, decoded, cs))
        n = len(images)
        rows.append((q, size / n / 1024, float(np.mean(psnrs)), enc_s / n * 1e3, dec_s / n * 1e3))
    return rows


def _at_psnr(rows: list[tuple[int, float, float, float, float]], target: float) -> float | None:
    psnr = np.array([r[2] for r in rows])
    kb = np.array([r[1] for r in rows])
    order = np.argsort(psnr)
    if target < psnr.min() - 1e-9 or target > psnr.max() + 1e-9:
        return None
    return float(np.exp(np.interp(target, psnr[order], np.log(kb[order]))))


def _writer_throughput(originals: list[np.ndarray], workers: list[int]) -> None:
    from kohakuclip import write_images

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        for i, px in enumerate(originals):
            Image.fromarray(px).save(os.path.join(src, f"{i:04d}.jpg"), quality=92)
        print("\nwriter (write_images, JPEG sources -> default JPEG shards), images/s:")
        for n in workers:
            out = os.path.join(tmp, f"out{n}")
            t0 = time.perf_counter()
            write_images(out, [src], workers=n, progress=False, min_short=0)
            dt = time.perf_counter() - t0
            print(f"  {n} worker thread(s): {len(originals) / dt:7.1f} images/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--crops", type=int, default=8)
    ap.add_argument("--targets", type=float, nargs="+", default=[38.0, 40.0, 42.0, 44.0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    args = ap.parse_args()

    print(
        f"{args.images} synthetic photo-like images (not real photos), 1024x768 / 800x600, "
        "stored at short side 512 (Lanczos-3); quality: PSNR of 256x256 random resized crops"
    )
    originals = [
        photo_like(i, *((768, 1024) if i % 2 == 0 else (600, 800))) for i in range(args.images)
    ]
    stored = []
    for px in originals:
        png = io.BytesIO()
        Image.fromarray(px).save(png, "PNG")
        stored.append(prepare(png.getvalue(), max_short=512).pixels)
    crops = [_crops(px.shape, args.crops, 100 + i) for i, px in enumerate(stored)]
    ceiling = np.mean([_crop_psnr(px, _roundtrip_420(px), cs) for px, cs in zip(stored, crops)])
    print(
        f"4:2:0 round trip alone, no compression: {ceiling:.2f} dB on these crops (a ceiling "
        "for the 4:2:0 families; real photos carry less colour detail)"
    )

    results = {}
    for family in _families():
        results[family.name] = _sweep(family, stored, crops)
        print(f"\n{family.name}")
        print("  quality   KB/img   PSNR dB   encode ms   decode ms")
        for q, kb, p, enc, dec in results[family.name]:
            print(f"  {q:7d} {kb:8.1f} {p:9.2f} {enc:11.1f} {dec:11.2f}")

    base_name = "JPEG 4:4:4 libjpeg-turbo (turbo)"
    print("\nKB per image at equal crop PSNR (interpolated), and relative to libjpeg-turbo 4:4:4:")
    header = "".join(f"{t:>18.1f} dB" for t in args.targets)
    print(f"{'family':46s}{header}")
    for name, rows in results.items():
        cells = []
        for t in args.targets:
            kb = _at_psnr(rows, t)
            ref = _at_psnr(results[base_name], t)
            if kb is None:
                cells.append(f"{'out of range':>21s}")
            elif ref is None:
                cells.append(f"{kb:12.1f}        ")
            else:
                cells.append(f"{kb:12.1f} ({100 * (kb / ref - 1):+5.1f}%)")
        print(f"{name:46s}{''.join(cells)}")
    _writer_throughput(originals, args.workers)


if __name__ == "__main__":
    main()
