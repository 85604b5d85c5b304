#pragma once
#include <opus/opus.h>

/* opus_*_ctl are variadic macros/functions Swift cannot call: fixed-signature wrappers.
   `request` is one of the OPUS_SET_* / OPUS_GET_* request constants (the *_REQUEST macros). */

static inline int copus_encoder_set(OpusEncoder *st, int request, opus_int32 value) {
    return opus_encoder_ctl(st, request, value);
}

static inline int copus_encoder_get(OpusEncoder *st, int request, opus_int32 *value) {
    return opus_encoder_ctl(st, request, value);
}

static inline int copus_encoder_reset(OpusEncoder *st) {
    return opus_encoder_ctl(st, OPUS_RESET_STATE);
}

static inline int copus_decoder_get(OpusDecoder *st, int request, opus_int32 *value) {
    return opus_decoder_ctl(st, request, value);
}

static inline int copus_decoder_reset(OpusDecoder *st) {
    return opus_decoder_ctl(st, OPUS_RESET_STATE);
}
