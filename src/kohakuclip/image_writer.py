"""The image writer under the module name the specification gives it
(``kohakuclip.image_writer.write_images``); the same function as ``kohakuclip.write_images``."""

from kohakuclip.write.images import write_images

__all__ = ["write_images"]
