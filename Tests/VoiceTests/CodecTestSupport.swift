import Dispatch
import Glibc

@testable import Voice

/// Runs CPU-heavy or spinning test work on a Dispatch thread and hands back its
/// result. Swift's cooperative pool has one thread per core: on a 2-core CI machine
/// two such bodies on it stalled every other suite (their 5 s timeouts fired).
/// Assertions stay in the test, on the returned values.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global().async { continuation.resume(with: Result { try body() }) }
    }
}

/// Real speech for codec tests: pocketsphinx-testdata raw files, 16 kHz 16-bit LE mono.
enum Speech {
    static let directory = "/usr/share/pocketsphinx/test/data/"

    /// The whole of `name` (e.g. "goforward.raw") at 16 kHz, or nil when the file is missing.
    static func raw16k(_ name: String = "goforward.raw") -> [Int16]? {
        guard let file = fopen(directory + name, "rb") else { return nil }
        defer { fclose(file) }
        var samples: [Int16] = []
        var chunk = [Int16](repeating: 0, count: 4096)
        while true {
            let got = chunk.withUnsafeMutableBytes { fread($0.baseAddress, 2, 4096, file) }
            if got == 0 { break }
            samples.append(contentsOf: chunk[0..<got].map { Int16(littleEndian: $0) })
        }
        return samples
    }

    /// 16 kHz → 8 kHz with a short low-pass ([1 2 1]/4) before dropping every other sample.
    static func decimate(_ input: [Int16]) -> [Int16] {
        guard input.count >= 3 else { return input }
        var out: [Int16] = []
        out.reserveCapacity(input.count / 2)
        var i = 1
        while i + 1 < input.count {
            out.append(Int16((Int(input[i - 1]) + 2 * Int(input[i]) + Int(input[i + 1])) / 4))
            i += 2
        }
        return out
    }
}

enum Signal {
    /// max over lag in 0...maxLag of the normalized cross-correlation of reference[n] with test[n + lag].
    static func bestLagCorrelation(_ reference: [Int16], _ test: [Int16], maxLag: Int) -> (correlation: Double, lag: Int) {
        bestCorrelation(reference, test, lags: 0...maxLag)
    }

    /// max over `lags` of the normalized cross-correlation of reference[n] with test[n + lag].
    static func bestCorrelation(_ reference: [Int16], _ test: [Int16], lags: ClosedRange<Int>) -> (correlation: Double, lag: Int)
    {
        var best = (correlation: -1.0, lag: 0)
        reference.withUnsafeBufferPointer { r in
            test.withUnsafeBufferPointer { t in
                for lag in lags {
                    let start = max(0, -lag)
                    let end = min(r.count, t.count - lag)
                    guard end > start else { continue }
                    var rr = 0.0
                    var tt = 0.0
                    var rt = 0.0
                    for i in start..<end {
                        let a = Double(r[i])
                        let b = Double(t[i + lag])
                        rr += a * a
                        tt += b * b
                        rt += a * b
                    }
                    let c = rr > 0 && tt > 0 ? rt / (rr * tt).squareRoot() : 0
                    if c > best.correlation { best = (c, lag) }
                }
            }
        }
        return best
    }

    /// Segmental SNR in dB of `test` against `reference`, each 20 ms segment at its
    /// own best lag within `drift` samples of the previous segment's: time-stretched
    /// output drifts against the reference, and this follows it. The first segment
    /// searches `initialLags`.
    static func trackedSegmentalSNR(
        reference: [Int16], test: [Int16], initialLags: ClosedRange<Int>, drift: Int = 40, segment: Int = 160
    ) -> Double {
        // The starting lag from the first 4 s only: a whole-signal search over
        // thousands of lags costs seconds of CPU in a debug build.
        var lag = bestCorrelation(Array(reference.prefix(32_000)), test, lags: initialLags).lag
        var total = 0.0
        var count = 0
        var i = 0
        while i + segment <= reference.count {
            var signal = 0.0
            for j in i..<(i + segment) { signal += Double(reference[j]) * Double(reference[j]) }
            if signal / Double(segment) > 100 * 100 {
                var best = (noise: Double.infinity, lag: lag)
                for l in (lag - drift)...(lag + drift) where i + l >= 0 && i + l + segment <= test.count {
                    var noise = 0.0
                    for j in i..<(i + segment) {
                        let d = Double(reference[j]) - Double(test[j + l])
                        noise += d * d
                    }
                    if noise < best.noise { best = (noise, l) }
                }
                if best.noise.isFinite {
                    lag = best.lag
                    total += min(max(10 * log10((signal + 1) / (best.noise + 1)), -10), 35)
                    count += 1
                }
            }
            i += segment
        }
        return count > 0 ? total / Double(count) : -10
    }

    /// Segmental SNR in dB of `test` against the aligned `reference`, over 20 ms
    /// segments where the reference has speech, each clamped to [-10, 35] dB.
    static func segmentalSNR(reference: [Int16], test: [Int16], segment: Int = 160) -> Double {
        var total = 0.0
        var count = 0
        var i = 0
        while i + segment <= min(reference.count, test.count) {
            var signal = 0.0
            var noise = 0.0
            for j in i..<(i + segment) {
                let r = Double(reference[j])
                let t = Double(test[j])
                signal += r * r
                noise += (r - t) * (r - t)
            }
            if signal / Double(segment) > 100 * 100 {
                total += min(max(10 * log10((signal + 1) / (noise + 1)), -10), 35)
                count += 1
            }
            i += segment
        }
        return count > 0 ? total / Double(count) : -10
    }

    static func rms<C: Collection>(_ samples: C) -> Double where C.Element == Int16 {
        guard !samples.isEmpty else { return 0 }
        let sum = samples.reduce(0.0) { $0 + Double($1) * Double($1) }
        return (sum / Double(samples.count)).squareRoot()
    }

    /// SNR in dB of `test` against `reference` (same alignment), over the given sample ranges.
    static func snr(_ reference: [Int16], _ test: [Int16], ranges: [Range<Int>]) -> Double {
        var signal = 0.0
        var noise = 0.0
        for range in ranges {
            for i in range where i < reference.count && i < test.count {
                let a = Double(reference[i])
                let d = Double(test[i]) - a
                signal += a * a
                noise += d * d
            }
        }
        return 10 * log10(max(signal, 1) / max(noise, 1))
    }
}

/// Encodes `pcm` frame by frame (the tail that does not fill a frame is dropped).
func encodeAll(_ encoder: any VoiceEncoder, _ pcm: [Int16]) throws -> [[UInt8]] {
    let frame = encoder.configuration.samplesPerFrame
    var packets: [[UInt8]] = []
    var buffer = [UInt8](repeating: 0, count: encoder.maximumPacketSize)
    var start = 0
    while start + frame <= pcm.count {
        let size = try pcm.withUnsafeBufferPointer { all in
            try buffer.withUnsafeMutableBytes { out in
                try encoder.encode(UnsafeBufferPointer(rebasing: all[start..<start + frame]), into: out)
            }
        }
        packets.append(Array(buffer[0..<size]))
        start += frame
    }
    return packets
}

/// Decodes packets in order; `lost(i)` says what to do for packet i instead of decoding it.
enum LossHandling { case decode, conceal, redundancy }

func decodeAll(_ decoder: any VoiceDecoder, _ packets: [[UInt8]], handling: (Int) -> LossHandling = { _ in .decode }) throws
    -> [Int16]
{
    let frame = decoder.configuration.samplesPerFrame
    var out = [Int16](repeating: 0, count: frame * packets.count)
    for (i, packet) in packets.enumerated() {
        let written = try out.withUnsafeMutableBufferPointer { all in
            let slot = UnsafeMutableBufferPointer(rebasing: all[i * frame..<(i + 1) * frame])
            switch handling(i) {
            case .decode:
                if packet.isEmpty { return try decoder.conceal(into: slot) }
                return try packet.withUnsafeBytes { try decoder.decode($0, into: slot) }
            case .conceal:
                return try decoder.conceal(into: slot)
            case .redundancy:
                guard i + 1 < packets.count, !packets[i + 1].isEmpty else { return try decoder.conceal(into: slot) }
                return try packets[i + 1].withUnsafeBytes { try decoder.decodeRedundancy(from: $0, into: slot) }
            }
        }
        if written != frame { throw VoiceError.invalidPacket("decoder wrote \(written) samples, not \(frame)") }
    }
    return out
}

/// A fresh empty directory under /tmp.
func temporaryDirectory() -> String? {
    var template = Array("/tmp/voice-tests-XXXXXX".utf8CString)
    return template.withUnsafeMutableBufferPointer { buffer -> String? in
        guard let base = buffer.baseAddress, mkdtemp(base) != nil else { return nil }
        return String(cString: base)
    }
}

/// Removes a directory made by `temporaryDirectory()` and everything under it.
func removeDirectory(_ path: String) {
    guard let directory = opendir(path) else {
        unlink(path)
        return
    }
    while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) {
            $0.bindMemory(to: CChar.self).baseAddress.map { String(cString: $0) } ?? ""
        }
        if name == "." || name == ".." { continue }
        let child = path + "/" + name
        if entry.pointee.d_type == UInt8(DT_DIR) { removeDirectory(child) } else { unlink(child) }
    }
    closedir(directory)
    rmdir(path)
}
