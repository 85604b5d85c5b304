import CPcap
import Foundation

/// Reads the records of a pcap or pcapng file through libpcap, one at a time.
///
/// Owns the libpcap handle and closes it on deinit. Not shared across tasks: it lives
/// inside a single call of ``Capture/read(path:)``.
final class CaptureReader {
    /// One record as stored in the file.
    struct Record {
        /// 1-based frame number.
        var frame: Int
        /// Seconds since the Unix epoch.
        var timestamp: Double
        /// The captured bytes (possibly fewer than were on the wire).
        var bytes: [UInt8]
        /// The frame's length on the wire.
        var originalLength: Int
    }

    let path: String
    /// The DLT value libpcap reports for the file (the first interface's for pcapng).
    let linkType: Int32
    private let handle: OpaquePointer
    private let divisor: Double
    private(set) var framesRead = 0

    /// Opens `path`; fails with a typed error when it is missing, unreadable or not a capture.
    init(path: String) throws(CaptureError) {
        self.path = path
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw CaptureError(code: .fileNotFound, path: path, message: "file not found")
        }
        guard !isDirectory.boolValue else {
            throw CaptureError(code: .unreadable, path: path, message: "is a directory, not a capture file")
        }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw CaptureError(code: .unreadable, path: path, message: "file is not readable (permission denied)")
        }
        let size = (try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? nil
        if let size, size < 4 {
            throw CaptureError(
                code: .notACapture, path: path, message: "not a pcap or pcapng file: only \(size) bytes long")
        }
        var errbuf = [CChar](repeating: 0, count: Int(PCAP_ERRBUF_SIZE) + 1)
        let opened = errbuf.withUnsafeMutableBufferPointer { buffer in
            pcap_open_offline_with_tstamp_precision(path, UInt32(PCAP_TSTAMP_PRECISION_NANO), buffer.baseAddress)
        }
        guard let opened else {
            let text = Self.string(errbuf)
            throw Self.classify(text, path: path, frame: nil, opening: true)
        }
        handle = opened
        linkType = pcap_datalink(opened)
        divisor = pcap_get_tstamp_precision(opened) == PCAP_TSTAMP_PRECISION_NANO ? 1e9 : 1e6
    }

    deinit {
        pcap_close(handle)
    }

    /// The next record, or `nil` at the end of the file.
    func next() throws(CaptureError) -> Record? {
        var header: UnsafeMutablePointer<pcap_pkthdr>?
        var data: UnsafePointer<UInt8>?
        let status = pcap_next_ex(handle, &header, &data)
        switch status {
        case 1:
            framesRead += 1
            guard let header else {
                throw CaptureError(code: .malformed, path: path, frame: framesRead, message: "libpcap returned no record header")
            }
            let captured = Int(header.pointee.caplen)
            let bytes: [UInt8]
            if captured == 0 {
                bytes = []
            } else if let data {
                bytes = Array(UnsafeBufferPointer(start: data, count: captured))
            } else {
                throw CaptureError(code: .malformed, path: path, frame: framesRead, message: "libpcap returned no record data")
            }
            let seconds = Double(header.pointee.ts.tv_sec)
            let fraction = Double(header.pointee.ts.tv_usec) / divisor
            return Record(
                frame: framesRead, timestamp: seconds + fraction, bytes: bytes,
                originalLength: max(Int(header.pointee.len), captured))
        case PCAP_ERROR_BREAK:  // -2: end of file
            return nil
        default:
            let text = pcap_geterr(handle).map { String(cString: $0) } ?? "unknown libpcap error \(status)"
            throw Self.classify(text, path: path, frame: framesRead + 1, opening: false)
        }
    }

    private static func string(_ buffer: [CChar]) -> String {
        let bytes = buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Maps a libpcap error message to a typed error.
    private static func classify(_ text: String, path: String, frame: Int?, opening: Bool) -> CaptureError {
        let lower = text.lowercased()
        if lower.contains("unknown file format") {
            return CaptureError(code: .notACapture, path: path, message: "not a pcap or pcapng file (libpcap: \(text))")
        }
        let place = frame.map { "in the block at frame \($0) (after \($0 - 1) complete frames)" } ?? "in the file header"
        if lower.contains("truncated") {
            return CaptureError(
                code: .truncated, path: path, frame: frame,
                message: "truncated capture file: it ends \(place) (libpcap: \(text))")
        }
        if lower.contains("no such file") {
            return CaptureError(code: .fileNotFound, path: path, message: "file not found (libpcap: \(text))")
        }
        if lower.contains("permission denied") || lower.contains("is a directory") {
            return CaptureError(code: .unreadable, path: path, message: "cannot open file (libpcap: \(text))")
        }
        return CaptureError(
            code: .malformed, path: path, frame: frame, message: "malformed capture file \(place) (libpcap: \(text))")
    }
}
