#if canImport(Glibc)
    @preconcurrency import Glibc
#endif

/// Writes out what `print` buffered on standard output, and nothing else:
/// `fflush(nil)` would take every stream's lock, standard input's too, which a
/// read of typed commands holds while it waits for a line.
func flushStandardOutput() {
    fflush(stdout)
}
