# Contract of flare._fast.image_positions: per-patch position rows of one image.
#
# Rows follow the packed patch order of flare._fast.image_patches (2 x 2 merge
# blocks). fill_positions (a def function) writes each patch's (row, column), its
# four bilinear taps into the side x side learned position table and their
# float32 weights, computed with the reference's float32 operations one by one.
