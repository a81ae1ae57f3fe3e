
static inline long window_span(long f, long end, long *ih, long *lo, long *hi) {
    /* the run of a shifted window from flat index f of the padded input plane to the end of its padded
       row (or `end`): returns its length. Its positions lo..hi read input row ih (from input column
       f % CONV_WP - CONV_PW on), the rest is zero padding; lo <= hi */
    const long col = f % CONV_WP;
    const long len = CONV_WP - col < end - f ? CONV_WP - col : end - f;
    *ih = f / CONV_WP - CONV_PH;
    *lo = *hi = 0;
    if (*ih >= 0 && *ih < CONV_H) {
        *lo = CONV_PW - col > 0 ? CONV_PW - col : 0;
        *hi = CONV_PW + CONV_W - col < len ? CONV_PW + CONV_W - col : len;
        *lo = *lo < *hi ? *lo : *hi;
    }
    return len;
}
