import Foundation
import Synchronization

/// A capture or playback device as the sound system names it.
public struct AudioDeviceInfo: Sendable, Equatable {
    public enum Direction: String, Sendable { case capture, playback }
    /// What `--in-device` / `--out-device` take (a PulseAudio source or sink name, a PortAudio device name).
    public var name: String
    /// The sound system's longer description (PulseAudio), else the name.
    public var description: String
    public var direction: Direction
    /// The device's own rate and channels (the sound system converts to and from the voice's).
    public var sampleRate: Int
    public var channels: Int
    public var isDefault = false

    public init(
        name: String, description: String, direction: Direction, sampleRate: Int, channels: Int, isDefault: Bool = false
    ) {
        self.name = name
        self.description = description
        self.direction = direction
        self.sampleRate = sampleRate
        self.channels = channels
        self.isDefault = isDefault
    }
}

/// One open device stream, blocking, used from one thread (the device's own).
protocol DeviceStream: AnyObject {
    /// Fills `buffer` with captured samples, waiting for them.
    func capture(into buffer: UnsafeMutableBufferPointer<Int16>) throws(VoiceError)
    /// Queues `samples` for playback, waiting for room.
    func play(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError)
    func close()
}

/// The live sound system: PulseAudio (or PipeWire's pulse server) when one answers,
/// else PortAudio (ALSA, JACK). Both libraries are loaded at run time: a machine
/// without them builds and runs Tusa, and only a device asked for says what to install.
public enum AudioDevices {
    public enum Backend: String, Sendable {
        case pulseAudio = "PulseAudio"
        case portAudio = "PortAudio"
    }

    private static let pulse: Result<PulseAudioLibrary, VoiceError> = Result { () throws(VoiceError) in
        try PulseAudioLibrary.load()
    }

    /// The backend and its devices: PulseAudio's sinks and sources when its server
    /// answers, else what PortAudio sees.
    public static func list() throws(VoiceError) -> (backend: Backend, devices: [AudioDeviceInfo]) {
        if case .success(let api) = pulse, let devices = api.devices() { return (.pulseAudio, devices) }
        let devices = try PortAudioDevice.deviceInfos()
        return (.portAudio, devices)
    }

    /// Throws, saying what to install, when neither a sound server answers nor PortAudio
    /// can be loaded: a device asked for on such a machine is a usage error before a call
    /// is placed, not a call that fails once it is connected.
    public static func checkAvailable() throws(VoiceError) {
        if case .success(let api) = pulse, api.devices() != nil { return }
        _ = try PortAudioDevice.library()
    }

    /// The device `name` picks: an exact name, else the one whose name or description
    /// contains it (ignoring case); an error naming the candidates when none or several do.
    public static func resolve(_ name: String, direction: AudioDeviceInfo.Direction) throws(VoiceError) -> String {
        try pick(name, among: try list().devices.filter { $0.direction == direction }, direction: direction)
    }

    /// Whether a sound card is on the voice clock: a live microphone or speaker.
    public static func areLive(source: AudioSource?, sink: AudioSink?) -> Bool {
        source is LiveCapture || sink is LivePlayback
    }

    /// The device asked for (nil: the default) and the rate to open it at, from one
    /// listing: what ``checkAvailable()``, ``resolve(_:direction:)`` and
    /// ``preferredRate(of:direction:fallback:)`` say one after another, without asking
    /// the sound server three times before a call is placed.
    public static func choose(_ name: String?, direction: AudioDeviceInfo.Direction, fallbackRate: Int) throws(VoiceError)
        -> (device: String?, sampleRate: Int)
    {
        guard case .success(let api) = pulse, let devices = api.devices() else {
            // No server: PortAudio, which converts rates itself.
            _ = try PortAudioDevice.library()
            guard let name else { return (nil, fallbackRate) }
            let candidates = try PortAudioDevice.deviceInfos().filter { $0.direction == direction }
            return (try pick(name, among: candidates, direction: direction), fallbackRate)
        }
        let candidates = devices.filter { $0.direction == direction }
        let device = try name.map { n throws(VoiceError) in try pick(n, among: candidates, direction: direction) }
        return (device, rate(of: device, among: candidates, fallback: fallbackRate))
    }

    /// The one of `candidates` that `name` picks (see ``resolve(_:direction:)``).
    private static func pick(_ name: String, among candidates: [AudioDeviceInfo], direction: AudioDeviceInfo.Direction)
        throws(VoiceError) -> String
    {
        if candidates.contains(where: { $0.name == name }) { return name }
        let wanted = name.lowercased()
        let matches = candidates.filter {
            $0.name.lowercased().contains(wanted) || $0.description.lowercased().contains(wanted)
        }
        if matches.count == 1, let only = matches.first { return only.name }
        let what = direction == .capture ? "capture" : "playback"
        let known = candidates.map { "\"\($0.name)\"" }.joined(separator: ", ")
        if matches.isEmpty {
            throw .device("no \(what) device named \"\(name)\"; there are: \(known.isEmpty ? "none" : known)")
        }
        throw .device(
            "\"\(name)\" names \(matches.count) \(what) devices: \(matches.map { "\"\($0.name)\"" }.joined(separator: ", "))")
    }

    /// The rate to open `device` (nil: the default) at: the sound server's device's own,
    /// so that the server converts nothing and Tusa's resampler does it once; `fallback`
    /// when no server answers (PortAudio converts in ALSA's plug layer) or the device is unknown.
    public static func preferredRate(of device: String?, direction: AudioDeviceInfo.Direction, fallback: Int) -> Int {
        guard case .success(let api) = pulse, let devices = api.devices() else { return fallback }
        return rate(of: device, among: devices.filter { $0.direction == direction }, fallback: fallback)
    }

    /// The sample rate of `device` (nil: the default) among a server's `candidates`, or `fallback`.
    private static func rate(of device: String?, among candidates: [AudioDeviceInfo], fallback: Int) -> Int {
        let match = candidates.first { candidate in device.map { candidate.name == $0 } ?? candidate.isDefault }
        guard let rate = match?.sampleRate, (8_000...192_000).contains(rate) else { return fallback }
        return rate
    }

    /// Opens `device` (nil: the default) on the backend that answers, blocking: call it from the device's thread.
    static func open(
        _ direction: AudioDeviceInfo.Direction, device: String?, sampleRate: Int, chunkSamples: Int
    ) throws(VoiceError) -> DeviceStream {
        if case .success(let api) = pulse {
            do {
                return try PulseAudioStream(
                    api, direction: direction, device: device, sampleRate: sampleRate, chunkSamples: chunkSamples)
            } catch {
                // A server that answers refused this device: its reason, not PortAudio's.
                if api.devices() != nil { throw error }
            }
        }
        return try PortAudioDevice(
            sampleRate: sampleRate, framesPerBuffer: chunkSamples, capture: direction == .capture,
            render: direction == .playback, deviceName: device)
    }
}

extension PortAudioDevice: DeviceStream {
    func capture(into buffer: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) { _ = try read(into: buffer) }
    func play(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) { try write(samples) }
}

/// What a live device did, for a call's report.
public struct LiveAudioStatistics: Sendable, Equatable, Codable {
    /// The device asked for, or "default".
    public var device: String
    /// From asking for the device to its first samples (capture) or first write (playback); nil before.
    public var openMilliseconds: Double?
    /// The least the queue between the device and the voice clock held over the last
    /// second, beyond the frame: the delay it adds.
    public var queueMilliseconds: Double
    /// The most `queueMilliseconds` has been.
    public var maximumQueueMilliseconds: Double
    /// Times the queue ran dry after it had started (a gap was heard or sent).
    public var underruns: Int
    /// Times a speaker's thread found less than a chunk queued and the voice loop's
    /// write came while it waited (at most a chunk's time), so it played on instead of
    /// playing a gap: a sound server (PulseAudio) still held two chunks, so nothing
    /// was heard. A wait the write did not end is an underrun. (Zero for a microphone.)
    public var lateWrites: Int
    /// Samples dropped or repeated to keep the two clocks together, and dropped because the queue was full.
    public var droppedSamples: Int
    public var repeatedSamples: Int
    public var overflowedSamples: Int
    /// Set when the device named went away and the default took its place.
    public var fellBackToDefault: Bool

    /// One line for a report: `what` is "capture" or "playback".
    public func summary(_ what: String) -> String {
        String(
            format: "%@ device %@: open in %@, queue %.0f ms (at most %.0f), %d underruns (%d late writes waited for), "
                + "%d samples dropped, %d repeated%@",
            what, device, openMilliseconds.map { String(format: "%.0f ms", $0) } ?? "-", queueMilliseconds,
            maximumQueueMilliseconds, underruns, lateWrites, droppedSamples, repeatedSamples,
            fellBackToDefault ? ", fell back to the default" : "")
    }

    /// A report's lines for the devices it used, one each (none for files).
    public static func reportLines(capture: Self?, playback: Self?) -> [String] {
        [("capture", capture), ("playback", playback)].compactMap { what, device in device.map { "  " + $0.summary(what) } }
    }

    /// The figures of `source` and `sink` where they are live devices (the capture device closed first).
    public static func of(source: AudioSource?, sink: AudioSink?) -> (capture: Self?, playback: Self?) {
        let capture = source as? LiveCapture
        capture?.close()
        return (capture?.statistics, (sink as? LivePlayback)?.statistics)
    }
}

/// The state a live device's thread and the voice clock share.
private final class LiveAudioShared: @unchecked Sendable {
    struct State {
        var fifo: DeviceFIFO
        var failure: VoiceError?
        var openMilliseconds: Double?
        var fellBack = false
        /// When the device's thread last pushed (capture) or pulled (playback) a chunk, in monotonic ns.
        var lastChunk: UInt64?
        /// ``LiveAudioStatistics/lateWrites``.
        var lateWrites = 0
    }
    let state: Mutex<State>
    let running = Atomic<Bool>(true)
    let exited = Atomic<Bool>(false)

    init(fifo: DeviceFIFO) { state = Mutex(State(fifo: fifo)) }
}

/// A live device on a thread of its own, between the device's clock and the voice
/// engine's: opening it (PortAudio probes every card; a sound server may be slow)
/// never holds up a call, and neither clock ever waits for the other (``DeviceFIFO``).
/// When the device named goes away (a headset unplugged), the default takes over
/// once; when that fails too, the next read or write says why.
public class LiveAudioDevice: @unchecked Sendable {
    public let sampleRate: Int
    public let direction: AudioDeviceInfo.Direction
    /// The device asked for (nil: the default).
    public let deviceName: String?
    fileprivate let shared: LiveAudioShared
    /// Samples the device reads or writes at once.
    let chunk: Int

    /// - Parameters:
    ///   - chunkMilliseconds: how much the device reads or writes at once.
    ///   - notice: called from the device's thread when it falls back to the default.
    init(
        direction: AudioDeviceInfo.Direction, deviceName: String?, sampleRate: Int, chunkMilliseconds: Int,
        targetMilliseconds: Int, pullsPerSecond: Int, capacityMilliseconds: Int = 2_000, keepMilliseconds: Int = 0,
        notice: (@Sendable (String) -> Void)?
    ) {
        self.sampleRate = sampleRate
        self.direction = direction
        self.deviceName = deviceName
        shared = LiveAudioShared(
            fifo: DeviceFIFO(
                target: sampleRate * targetMilliseconds / 1000, capacity: sampleRate * capacityMilliseconds / 1000,
                pullsPerSecond: pullsPerSecond, keepBeforeFirstPull: sampleRate * keepMilliseconds / 1000))
        let chunk = max(1, sampleRate * chunkMilliseconds / 1000)
        self.chunk = chunk
        let thread = Thread { [shared, direction, deviceName, sampleRate, notice] in
            Self.run(
                shared, direction: direction, deviceName: deviceName, sampleRate: sampleRate, chunk: chunk, notice: notice)
        }
        thread.name = direction == .capture ? "tusa.capture" : "tusa.playback"
        thread.qualityOfService = .userInteractive
        thread.start()
    }

    deinit { stopThread() }

    public var statistics: LiveAudioStatistics {
        let perMillisecond = Double(sampleRate) / 1000
        return shared.state.withLock { state in
            let q = state.fifo.statistics
            return LiveAudioStatistics(
                device: deviceName ?? "default", openMilliseconds: state.openMilliseconds,
                queueMilliseconds: Double(q.level) / perMillisecond,
                maximumQueueMilliseconds: Double(q.maximumLevel) / perMillisecond, underruns: q.underruns,
                lateWrites: state.lateWrites,
                droppedSamples: q.dropped, repeatedSamples: q.repeated, overflowedSamples: q.overflowed,
                fellBackToDefault: state.fellBack)
        }
    }

    /// The queue's level now, for ``DeviceClockFollower``: what it holds, and (a
    /// microphone) what the device has captured since its last chunk, or (a speaker)
    /// less what it has played since it took its last chunk, at most a chunk either
    /// way; nil while the queue is not primed; `backlog` while it takes one back.
    func level() -> (samples: Double?, backlog: Bool) {
        let now = DispatchTime.now().uptimeNanoseconds
        return shared.state.withLock { state in
            guard state.fifo.primed, let last = state.lastChunk else { return (nil, false) }
            let elapsed = min(Double(now &- last) / 1e9, Double(chunk) / Double(sampleRate))
            let made = elapsed * Double(sampleRate)
            return (Double(state.fifo.count) + (direction == .capture ? made : -made), state.fifo.catchingUp)
        }
    }

    /// Where ``level()`` is held: the middle of the queue's band (one and a half margins
    /// after a pull), and half of what a chunk adds between two of the device's.
    var clockSetpoint: Double {
        let target = shared.state.withLock { $0.fifo.target }
        return Double(target) * 1.5 + (direction == .capture ? 0.5 : -0.5) * Double(chunk)
    }

    /// The voice clock follows this device's queue from now (``DeviceFIFO/followed``).
    func followedByVoiceClock() { shared.state.withLock { $0.fifo.followed = true } }

    /// Asks the device's thread to stop and waits for it a little (it wakes at least every chunk).
    fileprivate func stopThread() {
        shared.running.store(false, ordering: .releasing)
        var waited = 0
        while !shared.exited.load(ordering: .acquiring) && waited < 200 {
            usleep(5_000)
            waited += 1
        }
    }

    private static func run(
        _ shared: LiveAudioShared, direction: AudioDeviceInfo.Direction, deviceName: String?, sampleRate: Int,
        chunk: Int, notice: (@Sendable (String) -> Void)?
    ) {
        defer { shared.exited.store(true, ordering: .releasing) }
        raiseAudioThreadPriority()
        let asked = DispatchTime.now().uptimeNanoseconds
        var name = deviceName
        var buffer = [Int16](repeating: 0, count: chunk)
        var stream: DeviceStream
        do {
            stream = try AudioDevices.open(direction, device: name, sampleRate: sampleRate, chunkSamples: chunk)
        } catch {
            shared.state.withLock { $0.failure = error }
            return
        }
        var first = true
        while shared.running.load(ordering: .acquiring) {
            do {
                if direction == .capture {
                    try buffer.withUnsafeMutableBufferPointer { b throws(VoiceError) in try stream.capture(into: b) }
                    shared.state.withLock { state in
                        buffer.withUnsafeBufferPointer { state.fifo.push($0) }
                        state.lastChunk = DispatchTime.now().uptimeNanoseconds
                    }
                } else {
                    let waited = waitForLateWrite(shared, chunk: chunk, sampleRate: sampleRate)
                    _ = shared.state.withLock { state in
                        state.lastChunk = DispatchTime.now().uptimeNanoseconds
                        return buffer.withUnsafeMutableBufferPointer { state.fifo.pull(into: $0, waited: waited) }
                    }
                    try buffer.withUnsafeBufferPointer { b throws(VoiceError) in try stream.play(b) }
                }
                if first {
                    first = false
                    let ms = Double(DispatchTime.now().uptimeNanoseconds - asked) / 1e6
                    shared.state.withLock { $0.openMilliseconds = ms }
                }
            } catch {
                stream.close()
                // The device named went away: the default once, then the error.
                let what = direction == .capture ? "capture" : "playback"
                let reason: String
                if case .device(let message) = error { reason = message } else { reason = "\(error)" }
                guard let gone = name, shared.running.load(ordering: .acquiring),
                    let fallback = try? AudioDevices.open(direction, device: nil, sampleRate: sampleRate, chunkSamples: chunk)
                else {
                    let device = name.map { "the \(what) device \"\($0)\"" } ?? "the default \(what) device"
                    shared.state.withLock { $0.failure = .device("\(device) stopped (\(reason))") }
                    return
                }
                notice?("the \(what) device \"\(gone)\" went away (\(reason)); using the default device")
                name = nil
                stream = fallback
                shared.state.withLock { $0.fellBack = true }
            }
        }
        stream.close()
    }

    /// A speaker's thread takes its next chunk as soon as the sound server has room for
    /// it, while the server still holds two more (``PulseAudioStream``'s three-chunk
    /// target): a voice loop that writes a few ms after that is not late for the ear.
    /// So a queue that holds less than a chunk is given up to a chunk's time before the
    /// pull plays silence, which would be a gap of 10-20 ms (the queue primes again
    /// before it plays). A device that holds less (PortAudio's, at its own latency)
    /// may run short during the wait, but for no longer than that gap.
    ///
    /// What the wait took from the server's buffer is told to the queue (returned, in
    /// samples, for ``DeviceFIFO/pull(into:waited:)``): otherwise a thread paced by the
    /// voice loop's writes rather than the device's would hide the device's drift from
    /// the queue, the waits would grow until one ran out, and the queue would run dry
    /// every minute or two (200 ppm is 20 ms in 100 s).
    private static func waitForLateWrite(_ shared: LiveAudioShared, chunk: Int, sampleRate: Int) -> Int {
        func short() -> Bool { shared.state.withLock { $0.fifo.primed && $0.fifo.count < chunk } }
        guard short() else { return 0 }
        let start = DispatchTime.now().uptimeNanoseconds
        let deadline = start + UInt64(chunk) * 1_000_000_000 / UInt64(sampleRate)
        while DispatchTime.now().uptimeNanoseconds < deadline && shared.running.load(ordering: .relaxed) {
            usleep(250)
            if !short() {
                shared.state.withLock { $0.lateWrites += 1 }
                break
            }
        }
        // (At most twice the deadline's: a thread stopped mid-wait must not pass days.)
        let elapsed = min(DispatchTime.now().uptimeNanoseconds &- start, 2 * (deadline - start))
        return Int(elapsed * UInt64(sampleRate) / 1_000_000_000)
    }
}

/// The sound card a voice loop's clock follows (``DeviceClockFollower``): its
/// microphone's queue, seen at each frame the loop takes, else its speaker's, seen at
/// each tick. Both queues are told, so that neither slips for drift the loop takes up
/// (their slips move the echo path). A voice loop keeps one as a variable of its thread.
public struct CardClock: Sendable {
    private let device: LiveAudioDevice
    private var follower: DeviceClockFollower

    /// Nil when neither is a live device.
    public init?(source: AudioSource?, sink: AudioSink?, framesPerSecond: Int, ticksPerSecond: Int) {
        if let capture = source as? LiveCapture {
            device = capture
            follower = DeviceClockFollower(
                queue: .capture, sampleRate: capture.sampleRate, pullsPerSecond: framesPerSecond,
                setpoint: capture.clockSetpoint)
        } else if let playback = sink as? LivePlayback {
            device = playback
            follower = DeviceClockFollower(
                queue: .playback, sampleRate: playback.sampleRate, pullsPerSecond: ticksPerSecond,
                setpoint: playback.clockSetpoint)
        } else {
            return nil
        }
        (source as? LiveCapture)?.followedByVoiceClock()
        (sink as? LivePlayback)?.followedByVoiceClock()
    }

    /// The voice clock's period against its nominal one (``DeviceClockFollower/scale``).
    public var scale: Double { follower.scale }

    /// The loop has just pulled from (`.capture`: taken a frame) or pushed to
    /// (`.playback`: a tick) that queue: the follower sees its level, when it follows it.
    public mutating func pulled(_ queue: DeviceClockFollower.Queue) {
        guard queue == follower.queue else { return }
        let (samples, backlog) = device.level()
        if backlog { follower.hold() } else { follower.observe(level: samples) }
    }
}

/// A microphone: ``AudioSource`` that never blocks. Until the device delivers, and
/// whenever it falls behind, it reads silence. What it captured before the first read
/// is dropped to the margin, so the call starts with fresh audio, but for the last
/// `keepMilliseconds` of it (at most 500).
public final class LiveCapture: LiveAudioDevice, AudioSource, @unchecked Sendable {
    /// Opens the device in the background and returns at once.
    /// - Parameter keepMilliseconds: how much of what is said before the call's audio
    ///   starts is sent rather than dropped: a caller who talks as the call is placed,
    ///   never one who answers (what was said before answering is not the caller's to
    ///   hear). The backlog delays the echo too, until the first pause: with a speaker's
    ///   own latency it must stay within the echo canceller's 256 ms tail.
    public init(
        deviceName: String? = nil, sampleRate: Int, keepMilliseconds: Int = 0, notice: (@Sendable (String) -> Void)? = nil
    ) {
        super.init(
            direction: .capture, deviceName: deviceName, sampleRate: sampleRate, chunkMilliseconds: 10,
            targetMilliseconds: 15, pullsPerSecond: 50, capacityMilliseconds: 5_000, keepMilliseconds: keepMilliseconds,
            notice: notice)
    }

    /// Always fills `output` (silence while the device is not delivering); throws once the device has failed.
    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        let failure: VoiceError? = shared.state.withLock { state in
            if let failure = state.failure { return failure }
            _ = state.fifo.pull(into: output)
            return nil
        }
        if let failure { throw failure }
        return output.count
    }

    public func close() { stopThread() }
}

/// A speaker: ``AudioSink`` that never blocks. Its thread plays what was written at
/// the device's own pace, silence when nothing is queued.
public final class LivePlayback: LiveAudioDevice, AudioSink, @unchecked Sendable {
    /// Opens the device in the background and returns at once.
    public init(deviceName: String? = nil, sampleRate: Int, notice: (@Sendable (String) -> Void)? = nil) {
        super.init(
            direction: .playback, deviceName: deviceName, sampleRate: sampleRate, chunkMilliseconds: 10,
            targetMilliseconds: 10, pullsPerSecond: 100, notice: notice)
    }

    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        let failure: VoiceError? = shared.state.withLock { state in
            if let failure = state.failure { return failure }
            state.fifo.push(samples)
            return nil
        }
        if let failure { throw failure }
    }

    public func close() { stopThread() }
}
