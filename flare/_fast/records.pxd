# The completion-record layout for Cython: one int64 record per physical slot, 16
# metadata fields then the token fields. This is the one Cython copy of the offsets
# in flare/contract.py (REC_*, RECORD_*); sched.record_layout() exposes it and
# tests/test_contract.py compares every field with the Python side.

cdef enum:
    RECORD_META = 16  # metadata fields per record
    RECORD_TOKENS = 8  # token fields after the metadata
    RECORD_FIELDS = RECORD_META + RECORD_TOKENS

    # Metadata fields.
    REC_SLOT = 0  # physical slot (0 for padding rows)
    REC_GENERATION = 1  # the slot's generation when the program ran
    REC_CONSUMED = 2  # cumulative tokens whose KV is written (the slot's position)
    REC_GENERATED = 3  # cumulative sampled tokens
    REC_NEW_TOKENS = 4  # tokens sampled by this program
    REC_KIND = 5  # GraphKind of the program
    REC_FLAGS = 6  # REC_FLAG_* bits
    REC_TOKEN0 = RECORD_META  # first sampled token

    # REC_FLAGS bits.
    REC_FLAG_PARTICIPATED = 1  # the slot took part in this program
    REC_FLAG_SAMPLED = 2  # a token was sampled
