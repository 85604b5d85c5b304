#if canImport(Glibc)
    @preconcurrency import Glibc
#elseif canImport(Musl)
    @preconcurrency import Musl
#endif

/// Writes out what `print` buffered on standard output, and nothing else:
/// `fflush(nil)` would take every stream's lock, standard input's too, which a
/// read of typed commands holds while it waits for a line.
func flushStandardOutput() {
    fflush(stdout)
}

/// Standard input's lines, read with read(2) on descriptor 0, not through stdio:
/// a stdio read that waits for a line holds standard input's lock, and C
/// libraries that lock every stream at exit (glibc from 2.39, musl) would then
/// wait for that line before the process could end.
struct StandardInputLines: Sequence, IteratorProtocol {
    private var pending: [UInt8] = []
    private var ended = false

    mutating func next() -> String? {
        while true {
            if let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = pending[..<newline]
                pending.removeSubrange(...newline)
                return String(decoding: line.last == UInt8(ascii: "\r") ? line.dropLast() : line, as: UTF8.self)
            }
            if ended {
                guard !pending.isEmpty else { return nil }
                defer { pending = [] }
                return String(decoding: pending, as: UTF8.self)
            }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
            if n > 0 {
                pending += chunk[..<n]
                // A line longer than this is not a command: dropped, not kept growing.
                if pending.count > 65_536 { pending = [] }
            } else if n < 0 && errno == EINTR {
                continue
            } else {
                ended = true
            }
        }
    }
}
