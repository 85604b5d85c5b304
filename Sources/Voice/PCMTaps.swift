import Glibc

/// A point in the voice pipeline whose PCM can be recorded.
public enum PCMStage: String, CaseIterable, Sendable {
    case captured
    case echoCancelled = "echo-cancelled"
    case sent, received, played

    fileprivate var slot: Int {
        switch self {
        case .captured: return 0
        case .echoCancelled: return 1
        case .sent: return 2
        case .received: return 3
        case .played: return 4
        }
    }
}

/// PCM taps: each stage of the pipeline written to <directory>/<stage>.wav (16-bit mono).
/// Not thread-safe: write each stage from one thread. A write failure is kept in
/// `firstError` and stops that stage; the call path never throws.
public final class PCMTaps {
    public let directory: String
    public let sampleRate: Int
    private var sinks: [WAVFileSink?]
    public private(set) var firstError: VoiceError?

    /// Creates `directory` if needed and opens one file per tapped stage.
    public init(directory: String, sampleRate: Int = voiceSampleRate, stages: Set<PCMStage> = Set(PCMStage.allCases))
        throws(VoiceError)
    {
        if mkdir(directory, 0o755) != 0 && errno != EEXIST {
            throw .file(path: directory, reason: String(cString: strerror(errno)))
        }
        self.directory = directory
        self.sampleRate = sampleRate
        var sinks = [WAVFileSink?](repeating: nil, count: PCMStage.allCases.count)
        for stage in PCMStage.allCases where stages.contains(stage) {
            sinks[stage.slot] = try WAVFileSink(path: Self.path(directory, stage), sampleRate: sampleRate)
        }
        self.sinks = sinks
    }

    deinit { close() }

    /// The file a stage is written to.
    public func path(of stage: PCMStage) -> String { Self.path(directory, stage) }

    private static func path(_ directory: String, _ stage: PCMStage) -> String {
        directory.hasSuffix("/") ? directory + stage.rawValue + ".wav" : directory + "/" + stage.rawValue + ".wav"
    }

    /// Appends one frame to the stage's file; no-op for stages not tapped.
    public func write(_ stage: PCMStage, _ samples: UnsafeBufferPointer<Int16>) {
        guard let sink = sinks[stage.slot] else { return }
        do throws(VoiceError) {
            try sink.write(samples)
        } catch {
            if firstError == nil { firstError = error }
            sink.close()
            sinks[stage.slot] = nil
        }
    }

    /// Closes every file (flushing its header); idempotent.
    public func close() {
        for index in sinks.indices {
            sinks[index]?.close()
            sinks[index] = nil
        }
    }
}
