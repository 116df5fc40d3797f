# Contract of flare._fast.image_png: PNG scanline reconstruction.
#
# reconstruct (a def function) takes inflated image data (height scanlines of a
# filter byte and width * bytes-per-pixel filtered bytes), undoes the five PNG
# filters row by row and reduces each row to RGB8 (+ alpha8): grey replicated,
# 16-bit samples cut to their high byte, as Pillow's unpackers do.
