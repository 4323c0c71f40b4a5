"""Writing shards. From Python, call the writers through the package root:
``kohakuclip.write_videos``, ``write_images``, ``merge``, ``encode``, ``pack``, ``encode_image``
and ``pack_images``; the modules here are their implementation and the CLIs."""

__all__: list[str] = []
