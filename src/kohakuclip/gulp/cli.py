"""Command lines: ingest (20BN JSON videos, image folders, image lists, any adapter class),
register an adapter class as a script, and check a gulp directory.

Options take GulpIO's spelling (``--videos_per_chunk``) or the dashed one (``--videos-per-chunk``).
GulpIO's ``--extend``, ``--shm_dir`` and ``--remove_duplicates`` are taken too, so that its
command lines run unchanged.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import re
import shlex
import stat
import sys
import typing
from collections.abc import Callable, Collection, Sequence
from typing import Any, ParamSpec

from kohakuclip._argtypes import bounded_int
from kohakuclip.errors import os_error_text
from kohakuclip.gulp.adapters import (
    AbstractDatasetAdapter,
    ImageFolderAdapter,
    ImageListAdapter,
    JsonVideoAdapter,
    VideoFolderAdapter,
)
from kohakuclip.gulp.frames import JPEG_QUALITY, GulpError
from kohakuclip.gulp.ingest import GulpIngestor
from kohakuclip.gulp.sanity import check_gulp_directory

__all__ = [
    "adapter_main",
    "image_folder_main",
    "image_list_main",
    "json_videos_main",
    "register_adapter_main",
    "sanity_check_main",
    "script_name",
    "video_folder_main",
]

_P = ParamSpec("_P")


def _option(parser: argparse.ArgumentParser, name: str, *aliases: str, **kwargs: Any) -> None:
    """``--a_b`` and ``--a-b`` for the same option, and for each of its other names."""
    flags = [
        flag
        for n in (name, *aliases)
        for flag in [f"--{n}"] + ([f"--{n.replace('_', '-')}"] if "_" in n else [])
    ]
    parser.add_argument(*flags, dest=name, **kwargs)


def _ingest_options(
    parser: argparse.ArgumentParser,
    per_chunk: str,
    order: bool = True,
    leave_out: Collection[str] = (),
) -> None:
    """The ingest options; ``order=False`` leaves out shuffle, seed and strict (an adapter
    class's own parameters then), ``leave_out`` those an adapter class already takes."""
    count = bounded_int(1)
    options: list[tuple[str, dict[str, Any]]] = [
        (per_chunk, {"type": count, "default": 100, "help": "items per chunk (default 100)"}),
        ("num_workers", {"type": count, "default": 4, "help": "processes (default 4)"}),
        (
            "quality",
            {
                "type": bounded_int(1, 100),
                "default": JPEG_QUALITY,
                "help": "JPEG quality, 1-100 (default 90)",
            },
        ),
    ]
    if order:
        options += [
            ("shuffle", {"action": "store_true", "help": "shuffle the items (seeded) first"}),
            ("seed", {"type": int, "default": 0, "help": "shuffle seed (default 0)"}),
            ("strict", {"action": "store_true", "help": "stop at an unreadable input"}),
        ]
    options.append(("quiet", {"action": "store_true", "help": "no progress bar"}))
    for name, kwargs in options:
        if name not in leave_out:
            _option(parser, name, **kwargs)


def _prog(name: str | None, argv: Sequence[str] | None) -> str:
    """The name the command was run by (any alias of its script); ``name`` (GulpIO's) when
    it is called from Python with ``argv``."""
    if argv is not None and name is not None:
        return name
    return os.path.basename(sys.argv[0]) or name or "gulp"


def _ingest_parser(
    prog: str, description: str, inputs: Sequence[str], per_chunk: str, size: str | None = None
) -> argparse.ArgumentParser:
    """A built-in adapter's command line: its inputs, the output directory, the ingest options,
    the short side ``size`` (when given) and the label map."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name in (*inputs, "output_directory"):
        parser.add_argument(name)
    _ingest_options(parser, per_chunk)
    if size is not None:
        _option(parser, size, type=int, default=-1, help="short side (default -1: keep)")
    _option(parser, "label2idx", default=None, help="JSON label map to use (dict or list)")
    _gulpio_options(parser)
    return parser


def _gulpio_options(parser: argparse.ArgumentParser) -> None:
    """GulpIO's ``--extend`` and ``--shm_dir``, taken so that its command lines run unchanged;
    neither changes what is written (GulpIO's own scripts never read ``--extend`` either)."""
    _option(
        parser,
        "extend",
        action="store_true",
        help="GulpIO's; always so here: into a directory that has chunks, new chunks are added "
        "after them and ids already there are skipped",
    )
    _option(
        parser,
        "shm_dir",
        metavar="DIR",
        help="GulpIO's folder for extracted frames; ignored: frames are extracted in memory",
    )


def _duplicates_option(parser: argparse.ArgumentParser) -> None:
    """``--remove_duplicate_ids``, also by GulpIO's name ``--remove_duplicates``."""
    _option(
        parser,
        "remove_duplicate_ids",
        "remove_duplicates",
        action="store_true",
        help="keep the first of repeated ids",
    )


def _adapter_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords every built-in adapter takes from the ingest options."""
    return {
        "shuffle": args.shuffle,
        "seed": args.seed,
        "label2idx": args.label2idx,
        "strict": args.strict,
    }


def _ingest(
    adapter: AbstractDatasetAdapter, output: str, per_chunk: int, args: argparse.Namespace
) -> int:
    """Ingest; a run that writes nothing new and finds nothing already there fails."""
    report = GulpIngestor(
        adapter, output, per_chunk, args.num_workers, quality=args.quality, progress=not args.quiet
    )()
    print(f"{output}: {report.written} items in {len(report.chunks)} new chunks")
    if report.existing:
        print(f"{len(report.existing)} ids already present, not written again")
    if report.repeated:
        shown = ", ".join(report.repeated[:20])
        print(f"{len(report.repeated)} repeated ids, written once (their first item): {shown}")
    if report.empty:
        print(f"{len(report.empty)} items without frames, skipped: {', '.join(report.empty[:20])}")
    if not report.written and not report.existing:
        found = f"{len(adapter)} items, none with frames" if len(adapter) else "no items"
        raise GulpError(f"{output}: nothing written ({found})")
    return 0


def _command(name: str | None) -> Callable[[Callable[_P, int]], Callable[_P, int]]:
    """Ends the command ``name`` (see ``_prog``) with ``prog: error: ...`` instead of a
    traceback: exit status 1 on a GulpError (bad input data), 2 on an OSError (a file or
    folder that cannot be read or written, named)."""

    def wrap(main: Callable[_P, int]) -> Callable[_P, int]:
        signature = inspect.signature(main)

        @functools.wraps(main)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> int:
            prog = _prog(name, signature.bind(*args, **kwargs).arguments.get("argv"))
            try:
                return main(*args, **kwargs)
            except GulpError as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                return 1
            except OSError as exc:
                print(f"{prog}: error: {os_error_text(exc)}", file=sys.stderr)
                return 2

        return run

    return wrap


@_command("gulp_20bn_json_videos")
def json_videos_main(argv: Sequence[str] | None = None) -> int:
    """gulp_20bn_json_videos: videos listed in a 20BN-style JSON file."""
    parser = _ingest_parser(
        _prog("gulp_20bn_json_videos", argv),
        "Gulp the videos listed in a JSON file ([{'id': ..., 'label': ...}]), "
        "found as <videos_dir>/<id>.<ext> or <videos_dir>/<id>/<one video>.",
        ["input_json", "videos_directory"],
        "videos_per_chunk",
        "frame_size",
    )
    _option(parser, "frame_rate", type=float, default=8, help="fps (default 8; <= 0: all)")
    _option(parser, "label_name", default=None, help="label key (default template or label)")
    _duplicates_option(parser)
    args = parser.parse_args(argv)
    adapter = JsonVideoAdapter(
        args.input_json,
        args.videos_directory,
        frame_size=args.frame_size,
        frame_rate=args.frame_rate,
        label_name=args.label_name,
        remove_duplicate_ids=args.remove_duplicate_ids,
        **_adapter_options(args),
    )
    return _ingest(adapter, args.output_directory, args.videos_per_chunk, args)


@_command("gulp_video_folder")
def video_folder_main(argv: Sequence[str] | None = None) -> int:
    """gulp_video_folder: videos in <label>/ subfolders."""
    parser = _ingest_parser(
        _prog("gulp_video_folder", argv),
        "Gulp videos_directory/<label>/**/<video>.",
        ["videos_directory"],
        "videos_per_chunk",
        "frame_size",
    )
    _option(parser, "frame_rate", type=float, default=8, help="fps (default 8; <= 0: all)")
    args = parser.parse_args(argv)
    adapter = VideoFolderAdapter(
        args.videos_directory,
        frame_size=args.frame_size,
        frame_rate=args.frame_rate,
        **_adapter_options(args),
    )
    return _ingest(adapter, args.output_directory, args.videos_per_chunk, args)


@_command("gulp_image_folder")
def image_folder_main(argv: Sequence[str] | None = None) -> int:
    """gulp_image_folder: images in <label>/ subfolders."""
    parser = _ingest_parser(
        _prog("gulp_image_folder", argv),
        "Gulp images_directory/<label>/**/<image>.",
        ["images_directory"],
        "images_per_chunk",
        "image_size",
    )
    args = parser.parse_args(argv)
    adapter = ImageFolderAdapter(
        args.images_directory, image_size=args.image_size, **_adapter_options(args)
    )
    return _ingest(adapter, args.output_directory, args.images_per_chunk, args)


@_command("gulp_image_list")
def image_list_main(argv: Sequence[str] | None = None) -> int:
    """gulp_image_list: a text file of 'path, label' lines."""
    parser = _ingest_parser(
        _prog("gulp_image_list", argv),
        "Gulp the images of a 'path, label' list.",
        ["image_list_file"],
        "images_per_chunk",
        "image_size",
    )
    _option(parser, "root_path", default="", help="folder the listed paths are relative to")
    _duplicates_option(parser)
    args = parser.parse_args(argv)
    adapter = ImageListAdapter(
        args.image_list_file,
        root_folder=args.root_path,
        image_size=args.image_size,
        remove_duplicate_ids=args.remove_duplicate_ids,
        **_adapter_options(args),
    )
    return _ingest(adapter, args.output_directory, args.images_per_chunk, args)


@_command("gulp_sanity_check")
def sanity_check_main(argv: Sequence[str] | None = None) -> int:
    """gulp_sanity_check: exit 1 and list the bad files when a check fails."""
    parser = argparse.ArgumentParser(
        prog=_prog("gulp_sanity_check", argv),
        description="Check a gulp directory: content present, data size equal to the last "
        "frame's end, no duplicate ids. Exit status 1 when a check fails.",
    )
    parser.add_argument("gulp_directory")
    report = check_gulp_directory(parser.parse_args(argv).gulp_directory)
    if report.ok:
        print(f"{report.root}: {report.chunks} chunks, {report.ids} ids, no problems")
        return 0
    for line in report.lines():
        print(line)
    print("bad files:")
    for path in report.bad_files:
        print(f"  {path}")
    return 1


def _parameter_type(param: inspect.Parameter) -> Callable[[str], Any]:
    """float or int as the annotation says (``frame_rate: float = 8`` takes 2.5), else as the
    default's type, else str."""
    for kind in (float, int):
        if param.annotation is kind or kind in typing.get_args(param.annotation):
            return kind
    if type(param.default) in (int, float):
        return type(param.default)
    return str


_INGEST_DEFAULTS = {"videos_per_chunk": 100, "num_workers": 4, "quality": JPEG_QUALITY}
"""The ingest options of an adapter's command line, by name, with their defaults."""


def _shared_ingest_value(name: str, value: Any) -> Any:
    """What the ingestor takes from an option the adapter class also has (one option serves
    both): the value (as typed, for an option without a type of its own) when it is a count it
    can use, else the ingest default."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if name == "quality":
        valid = valid and value <= 100
    return value if valid else _INGEST_DEFAULTS[name]


@_command(None)
def adapter_main(adapter_cls: type, argv: Sequence[str] | None = None) -> int:
    """A command line built from an adapter class's ``__init__``: required parameters are
    positional, the others options (booleans as ``--name`` / ``--no-name``); then the output
    directory (passed as ``output_folder`` too, if the adapter takes one) and ingest options."""
    try:
        signature = inspect.signature(adapter_cls, eval_str=True)
    except NameError:  # annotations that do not resolve: the defaults' types still work
        signature = inspect.signature(adapter_cls)
    outputs = ("output_folder", "output_directory")  # given the output directory
    params = [
        p
        for p in signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in outputs
    ]
    taken = {p.name for p in params}
    parser = argparse.ArgumentParser(
        prog=_prog(None, argv), description=f"Gulp with {adapter_cls.__name__}."
    )
    for p in params:
        if p.default is inspect.Parameter.empty:
            parser.add_argument(p.name, type=_parameter_type(p))
        elif isinstance(p.default, bool):
            _option(parser, p.name, action=argparse.BooleanOptionalAction, default=p.default)
        else:
            _option(parser, p.name, type=_parameter_type(p), default=p.default)
    parser.add_argument("output_directory")
    _ingest_options(parser, "videos_per_chunk", order=False, leave_out=taken)
    args = parser.parse_args(argv)
    kwargs = {p.name: getattr(args, p.name) for p in params}
    for name in outputs:
        if name in signature.parameters:
            kwargs[name] = args.output_directory
    adapter = adapter_cls(**kwargs)
    for name in taken & _INGEST_DEFAULTS.keys():
        setattr(args, name, _shared_ingest_value(name, getattr(args, name)))
    if "quiet" in taken:
        quiet = args.quiet
        args.quiet = quiet is True or str(quiet).lower() in ("1", "true", "yes")
    return _ingest(adapter, args.output_directory, args.videos_per_chunk, args)


def script_name(class_name: str) -> str:
    """``MyVideoAdapter`` -> ``my_video_adapter`` (the registered script's file name)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()


_SCRIPT = '''#!{python}
"""Gulp a dataset with {module}.{name} (written by gulp_register_adapter)."""

import sys
{search}
from kohakuclip.gulp.cli import adapter_main
from {module} import {name}

if __name__ == "__main__":
    sys.exit(adapter_main({name}))
'''


@_command("gulp_register_adapter")
def register_adapter_main(argv: Sequence[str] | None = None) -> int:
    """gulp_register_adapter: write an executable command line for an adapter class."""
    parser = argparse.ArgumentParser(
        prog=_prog("gulp_register_adapter", argv),
        description="Write a script that gulps a dataset with your adapter class; its "
        "options come from the class's __init__.",
    )
    parser.add_argument("adapter_module", help="importable module, e.g. my_project.adapters")
    parser.add_argument("class_name")
    parser.add_argument("-o", "--output", help="script path (default: ./<class_name_snake>)")
    args = parser.parse_args(argv)
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(args.adapter_module)
    except ImportError as exc:
        raise GulpError(f"cannot import {args.adapter_module!r} ({exc})") from exc
    cls = getattr(module, args.class_name, None)
    if not (inspect.isclass(cls) and hasattr(cls, "iter_data") and hasattr(cls, "__len__")):
        raise GulpError(f"{args.adapter_module}.{args.class_name}: not an adapter class")
    path = args.output or script_name(args.class_name)
    # a module found in this folder is found by the script wherever it is written and run
    here = os.path.abspath(getattr(module, "__file__", None) or "").startswith(cwd + os.sep)
    search = f"\nsys.path.append({cwd!r})\n" if here else ""
    with open(path, "w", encoding="utf-8") as f:
        f.write(
            _SCRIPT.format(
                python=sys.executable,
                module=args.adapter_module,
                name=args.class_name,
                search=search,
            )
        )
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    command = path if os.sep in path else os.path.join(".", path)  # a bare name is not run
    print(f"wrote {path}: run {shlex.quote(command)} --help")
    return 0
