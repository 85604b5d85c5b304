import CSpeexDSP

/// speexdsp's resampler, streaming, mono Int16: any chunk size in, whole samples
/// out, the filter state carried from one call to the next.
public final class Resampler {
    public let inputRate: Int
    public let outputRate: Int
    private let state: OpaquePointer

    /// - Parameter quality: 0 (fastest) ... 10 (best); 5 is speexdsp's VoIP default.
    public init(from inputRate: Int, to outputRate: Int, quality: Int = 5) throws(VoiceError) {
        guard (1000...384_000).contains(inputRate), (1000...384_000).contains(outputRate) else {
            throw .invalidConfiguration("resampler rates must be 1000...384000 Hz, not \(inputRate) → \(outputRate)")
        }
        guard (0...10).contains(quality) else {
            throw .invalidConfiguration("resampler quality must be 0...10, not \(quality)")
        }
        var error: Int32 = 0
        guard let state = speex_resampler_init(1, UInt32(inputRate), UInt32(outputRate), Int32(quality), &error),
            error == 0
        else { throw .library("speex_resampler_init(\(inputRate) → \(outputRate))", code: error) }
        self.state = state
        self.inputRate = inputRate
        self.outputRate = outputRate
    }

    deinit { speex_resampler_destroy(state) }

    /// Upper bound on the samples `process` writes for `inputCount` input samples.
    public func outputCapacity(forInput inputCount: Int) -> Int {
        (inputCount * outputRate + inputRate - 1) / inputRate + 2
    }

    /// Consumes all of `input`; returns the samples written to `output`.
    public func process(_ input: UnsafeBufferPointer<Int16>, into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError)
        -> Int
    {
        let needed = outputCapacity(forInput: input.count)
        guard output.count >= needed else { throw .bufferTooSmall(needed: needed, available: output.count) }
        guard let inBase = input.baseAddress, !input.isEmpty else { return 0 }
        guard let outBase = output.baseAddress else { throw .bufferTooSmall(needed: needed, available: 0) }
        var consumed = 0
        var produced = 0
        // speexdsp may stop early when its output window is full; loop until all input is in.
        while consumed < input.count {
            var inLength = UInt32(input.count - consumed)
            var outLength = UInt32(output.count - produced)
            let result = speex_resampler_process_int(state, 0, inBase + consumed, &inLength, outBase + produced, &outLength)
            guard result == 0 else { throw .library("speex_resampler_process_int", code: result) }
            consumed += Int(inLength)
            produced += Int(outLength)
            if inLength == 0 && outLength == 0 { break }
        }
        return produced
    }

    /// The filter's delay in output samples.
    public var latencySamples: Int { Int(speex_resampler_get_output_latency(state)) }

    /// Forget the stream (the next call starts like the first).
    public func reset() {
        speex_resampler_reset_mem(state)
    }
}

extension Resampler {
    /// A whole signal resampled, with the filter's delay removed so that input and
    /// output line up sample for sample (output length = input length × ratio).
    public static func resampleAll(_ input: [Int16], from inputRate: Int, to outputRate: Int) throws(VoiceError) -> [Int16] {
        if inputRate == outputRate { return input }
        let resampler = try Resampler(from: inputRate, to: outputRate)
        let wanted = Int((Int64(input.count) * Int64(outputRate)) / Int64(inputRate))
        let latency = resampler.latencySamples
        // Flush with silence as long as the filter's delay, so the tail comes out too.
        let flush = [Int16](repeating: 0, count: (latency + 2) * inputRate / outputRate + 2)
        var out = [Int16](
            repeating: 0,
            count: resampler.outputCapacity(forInput: input.count) + resampler.outputCapacity(forInput: flush.count))
        var produced = 0
        for chunk in [input, flush] {
            produced += try chunk.withUnsafeBufferPointer { (inp) throws(VoiceError) -> Int in
                try out.withUnsafeMutableBufferPointer { (all) throws(VoiceError) -> Int in
                    try resampler.process(inp, into: UnsafeMutableBufferPointer(rebasing: all[produced...]))
                }
            }
        }
        let start = min(latency, produced)
        let end = min(start + wanted, produced)
        var result = Array(out[start..<end])
        if result.count < wanted { result += [Int16](repeating: 0, count: wanted - result.count) }
        return result
    }
}
