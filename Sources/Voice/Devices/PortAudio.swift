import Glibc

/// PaDeviceInfo from portaudio.h (v19, structVersion 2), declared here because the
/// library is loaded at run time and there is no build dependency on its headers.
private struct PaDeviceInfo {
    var structVersion: Int32
    var name: UnsafePointer<CChar>?
    var hostApi: Int32
    var maxInputChannels: Int32
    var maxOutputChannels: Int32
    var defaultLowInputLatency: Double
    var defaultLowOutputLatency: Double
    var defaultHighInputLatency: Double
    var defaultHighOutputLatency: Double
    var defaultSampleRate: Double
}

/// PaStreamParameters from portaudio.h v19.
private struct PaStreamParameters {
    var device: Int32
    var channelCount: Int32
    var sampleFormat: UInt
    var suggestedLatency: Double
    var hostApiSpecificStreamInfo: UnsafeMutableRawPointer?
}

private let paNoError: Int32 = 0
private let paNoDevice: Int32 = -1
private let paInputOverflowed: Int32 = -9981
private let paOutputUnderflowed: Int32 = -9980
private let paInt16: UInt = 0x0000_0008

/// The PortAudio entry points, resolved with dlopen/dlsym. Immutable after loading.
final class PortAudioLibrary: @unchecked Sendable {
    typealias Simple = @convention(c) () -> Int32
    typealias GetDeviceInfo = @convention(c) (Int32) -> UnsafeRawPointer?
    typealias OpenStream =
        @convention(c) (
            UnsafeMutablePointer<UnsafeMutableRawPointer?>, UnsafeRawPointer?, UnsafeRawPointer?, Double, UInt, UInt,
            UnsafeRawPointer?, UnsafeMutableRawPointer?
        ) -> Int32
    typealias OpenDefaultStream =
        @convention(c) (
            UnsafeMutablePointer<UnsafeMutableRawPointer?>, Int32, Int32, UInt, Double, UInt, UnsafeRawPointer?,
            UnsafeMutableRawPointer?
        ) -> Int32
    typealias StreamCall = @convention(c) (UnsafeMutableRawPointer) -> Int32
    typealias ReadStream = @convention(c) (UnsafeMutableRawPointer, UnsafeMutableRawPointer, UInt) -> Int32
    typealias WriteStream = @convention(c) (UnsafeMutableRawPointer, UnsafeRawPointer, UInt) -> Int32
    typealias ErrorText = @convention(c) (Int32) -> UnsafePointer<CChar>?

    static let installHint = "install PortAudio v19 (Debian/Ubuntu package libportaudio2)"

    let initialize: Simple
    let terminate: Simple
    let deviceCount: Simple
    let deviceInfo: GetDeviceInfo
    let defaultInputDevice: Simple
    let defaultOutputDevice: Simple
    let openStream: OpenStream
    let openDefaultStream: OpenDefaultStream
    let startStream: StreamCall
    let stopStream: StreamCall
    let closeStream: StreamCall
    let readStream: ReadStream
    let writeStream: WriteStream
    let errorText: ErrorText

    private init(handle: UnsafeMutableRawPointer, name: String) throws(VoiceError) {
        func symbol<T>(_ symbolName: String, as type: T.Type) throws(VoiceError) -> T {
            guard let address = dlsym(handle, symbolName) else {
                throw .unavailable("\(name) has no \(symbolName): \(PortAudioLibrary.installHint)")
            }
            return unsafeBitCast(address, to: type)
        }
        initialize = try symbol("Pa_Initialize", as: Simple.self)
        terminate = try symbol("Pa_Terminate", as: Simple.self)
        deviceCount = try symbol("Pa_GetDeviceCount", as: Simple.self)
        deviceInfo = try symbol("Pa_GetDeviceInfo", as: GetDeviceInfo.self)
        defaultInputDevice = try symbol("Pa_GetDefaultInputDevice", as: Simple.self)
        defaultOutputDevice = try symbol("Pa_GetDefaultOutputDevice", as: Simple.self)
        openStream = try symbol("Pa_OpenStream", as: OpenStream.self)
        openDefaultStream = try symbol("Pa_OpenDefaultStream", as: OpenDefaultStream.self)
        startStream = try symbol("Pa_StartStream", as: StreamCall.self)
        stopStream = try symbol("Pa_StopStream", as: StreamCall.self)
        closeStream = try symbol("Pa_CloseStream", as: StreamCall.self)
        readStream = try symbol("Pa_ReadStream", as: ReadStream.self)
        writeStream = try symbol("Pa_WriteStream", as: WriteStream.self)
        errorText = try symbol("Pa_GetErrorText", as: ErrorText.self)
    }

    /// dlopen's `name` (kept loaded for the life of the process), with the libraries
    /// under it kept quiet (``silenceProbes()``).
    static func load(_ name: String) throws(VoiceError) -> PortAudioLibrary {
        // PortAudio's JACK host would start a JACK server when none runs.
        setenv("JACK_NO_START_SERVER", "1", 0)
        guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else {
            let reason = dlerror().map { String(cString: $0) } ?? "not found"
            throw .unavailable("PortAudio (\(name)) cannot be loaded: \(reason); \(installHint)")
        }
        do {
            let library = try PortAudioLibrary(handle: handle, name: name)
            silenceProbes()
            return library
        } catch {
            dlclose(handle)
            throw error
        }
    }

    /// Pa_Initialize probes every ALSA card and the JACK server, and ALSA and JACK
    /// print each miss on stderr (dozens of lines on a machine with PulseAudio and no
    /// JACK) over the call's status line. Their errors reach Tusa as return codes
    /// anyway: hand both libraries a handler that prints nothing. Only the libraries
    /// PortAudio itself loaded are touched (RTLD_NOLOAD).
    private static func silenceProbes() {
        if let alsa = dlopen("libasound.so.2", RTLD_NOW | RTLD_NOLOAD),
            let setHandler = dlsym(alsa, "snd_lib_error_set_handler")
        {
            typealias SetHandler = @convention(c) (AlsaErrorHandler?) -> Int32
            _ = unsafeBitCast(setHandler, to: SetHandler.self)(quietAlsaError)
        }
        if let jack = dlopen("libjack.so.0", RTLD_NOW | RTLD_NOLOAD) {
            typealias SetFunction = @convention(c) (JackMessageHandler?) -> Void
            for setter in ["jack_set_error_function", "jack_set_info_function"] {
                guard let address = dlsym(jack, setter) else { continue }
                unsafeBitCast(address, to: SetFunction.self)(quietJackMessage)
            }
        }
    }

    func message(_ code: Int32) -> String {
        errorText(code).map { String(cString: $0) } ?? "PortAudio error"
    }

    /// Pa_Initialize; every success must be paired with `terminate`.
    func start() throws(VoiceError) {
        let result = initialize()
        guard result == paNoError else { throw .device("Pa_Initialize: \(message(result)) (\(result))") }
    }

    /// Device indices and infos (between Pa_Initialize and Pa_Terminate).
    fileprivate func devices() -> [(index: Int32, info: PaDeviceInfo)] {
        let count = deviceCount()
        guard count > 0 else { return [] }
        var result: [(index: Int32, info: PaDeviceInfo)] = []
        for index in 0..<count {
            guard let raw = deviceInfo(index) else { continue }
            result.append((index, raw.load(as: PaDeviceInfo.self)))
        }
        return result
    }
}

/// snd_lib_error_handler_t is variadic; a handler that reads none of its arguments
/// may be declared without the tail (the System V and AAPCS64 calling conventions
/// pass the named arguments alike either way).
private typealias AlsaErrorHandler =
    @convention(c) (UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?) -> Void
private typealias JackMessageHandler = @convention(c) (UnsafePointer<CChar>?) -> Void
private let quietAlsaError: AlsaErrorHandler = { _, _, _, _, _ in }
private let quietJackMessage: JackMessageHandler = { _ in }

private let sharedPortAudio: Result<PortAudioLibrary, VoiceError> = Result { () throws(VoiceError) in
    try PortAudioLibrary.load("libportaudio.so.2")
}

/// Live microphone/speaker through PortAudio, loaded at run time with dlopen("libportaudio.so.2") — no build
/// dependency; when the library is missing every entry point throws VoiceError.unavailable with a message saying
/// which package to install (Debian `libportaudio2`).
///
/// Mono 16-bit, blocking read/write. Open and close devices from one thread
/// (Pa_Initialize/Pa_Terminate are not thread-safe); read and write from the audio thread.
public final class PortAudioDevice: AudioSource, AudioSink {
    /// Whether libportaudio.so.2 could be loaded.
    public static var isAvailable: Bool {
        if case .success = sharedPortAudio { return true }
        return false
    }

    static func library() throws(VoiceError) -> PortAudioLibrary {
        switch sharedPortAudio {
        case .success(let library): return library
        case .failure(let error): throw error
        }
    }

    /// Names of the devices PortAudio sees, with their input/output channel counts.
    public static func listDevices() throws(VoiceError) -> [String] {
        let api = try library()
        try api.start()
        defer { _ = api.terminate() }
        return api.devices().map { device in
            let name = device.info.name.map { String(cString: $0) } ?? "device \(device.index)"
            return "\(name) (in \(device.info.maxInputChannels), out \(device.info.maxOutputChannels))"
        }
    }

    /// The devices PortAudio sees, one entry per direction each offers, the defaults marked.
    static func deviceInfos() throws(VoiceError) -> [AudioDeviceInfo] {
        let api = try library()
        try api.start()
        defer { _ = api.terminate() }
        let defaultInput = api.defaultInputDevice()
        let defaultOutput = api.defaultOutputDevice()
        var result: [AudioDeviceInfo] = []
        for device in api.devices() {
            let name = device.info.name.map { String(cString: $0) } ?? "device \(device.index)"
            let rate = Int(device.info.defaultSampleRate.isFinite ? device.info.defaultSampleRate : 0)
            if device.info.maxInputChannels > 0 {
                result.append(
                    AudioDeviceInfo(
                        name: name, description: name, direction: .capture, sampleRate: rate,
                        channels: Int(device.info.maxInputChannels), isDefault: device.index == defaultInput))
            }
            if device.info.maxOutputChannels > 0 {
                result.append(
                    AudioDeviceInfo(
                        name: name, description: name, direction: .playback, sampleRate: rate,
                        channels: Int(device.info.maxOutputChannels), isDefault: device.index == defaultOutput))
            }
        }
        return result
    }

    public let sampleRate: Int
    public let framesPerBuffer: Int
    public let capture: Bool
    public let render: Bool
    private let api: PortAudioLibrary
    private var stream: UnsafeMutableRawPointer?

    /// Opens and starts a stream. `deviceName` picks the first device whose name contains it; nil: the defaults.
    public convenience init(sampleRate: Int, framesPerBuffer: Int, capture: Bool, render: Bool, deviceName: String? = nil)
        throws(VoiceError)
    {
        try self.init(
            library: try Self.library(), sampleRate: sampleRate, framesPerBuffer: framesPerBuffer,
            capture: capture, render: render, deviceName: deviceName)
    }

    init(
        library api: PortAudioLibrary, sampleRate: Int, framesPerBuffer: Int, capture: Bool, render: Bool,
        deviceName: String?
    ) throws(VoiceError) {
        guard capture || render else { throw .invalidConfiguration("PortAudioDevice needs capture, render or both") }
        guard (8_000...192_000).contains(sampleRate) else {
            throw .invalidConfiguration("device sampleRate \(sampleRate) Hz is outside 8000...192000")
        }
        guard (0...65_536).contains(framesPerBuffer) else {
            throw .invalidConfiguration("framesPerBuffer \(framesPerBuffer) is outside 0...65536 (0: PortAudio chooses)")
        }
        self.api = api
        self.sampleRate = sampleRate
        self.framesPerBuffer = framesPerBuffer
        self.capture = capture
        self.render = render
        try api.start()
        do {
            stream = try Self.open(
                api, sampleRate: sampleRate, framesPerBuffer: framesPerBuffer,
                capture: capture, render: render, deviceName: deviceName)
        } catch {
            _ = api.terminate()
            throw error
        }
    }

    private static func open(
        _ api: PortAudioLibrary, sampleRate: Int, framesPerBuffer: Int, capture: Bool, render: Bool,
        deviceName: String?
    ) throws(VoiceError) -> UnsafeMutableRawPointer {
        var inputDevice = capture ? api.defaultInputDevice() : paNoDevice
        var outputDevice = render ? api.defaultOutputDevice() : paNoDevice
        let devices = api.devices()
        if let deviceName {
            func find(_ wanted: (PaDeviceInfo) -> Bool) -> Int32? {
                devices.first { device in
                    let name = device.info.name.map { String(cString: $0) } ?? ""
                    return name.contains(deviceName) && wanted(device.info)
                }?.index
            }
            if capture {
                guard let index = find({ $0.maxInputChannels > 0 }) else {
                    throw .device("no capture device named \"\(deviceName)\" among \(devices.count) devices")
                }
                inputDevice = index
            }
            if render {
                guard let index = find({ $0.maxOutputChannels > 0 }) else {
                    throw .device("no playback device named \"\(deviceName)\" among \(devices.count) devices")
                }
                outputDevice = index
            }
        }
        if capture && inputDevice < 0 { throw .device("no default capture device (PortAudio sees \(devices.count) devices)") }
        if render && outputDevice < 0 { throw .device("no default playback device (PortAudio sees \(devices.count) devices)") }
        func latency(_ index: Int32, input: Bool) -> Double {
            guard let info = devices.first(where: { $0.index == index })?.info else { return 0.05 }
            return input ? info.defaultLowInputLatency : info.defaultLowOutputLatency
        }
        var inputParameters = PaStreamParameters(
            device: inputDevice, channelCount: 1, sampleFormat: paInt16,
            suggestedLatency: latency(inputDevice, input: true), hostApiSpecificStreamInfo: nil)
        var outputParameters = PaStreamParameters(
            device: outputDevice, channelCount: 1, sampleFormat: paInt16,
            suggestedLatency: latency(outputDevice, input: false), hostApiSpecificStreamInfo: nil)
        var stream: UnsafeMutableRawPointer?
        let result = withUnsafePointer(to: &inputParameters) { input in
            withUnsafePointer(to: &outputParameters) { output in
                api.openStream(
                    &stream, capture ? UnsafeRawPointer(input) : nil, render ? UnsafeRawPointer(output) : nil,
                    Double(sampleRate), UInt(framesPerBuffer), 0, nil, nil)
            }
        }
        guard result == paNoError, let stream else { throw .device("Pa_OpenStream: \(api.message(result)) (\(result))") }
        let started = api.startStream(stream)
        guard started == paNoError else {
            _ = api.closeStream(stream)
            throw .device("Pa_StartStream: \(api.message(started)) (\(started))")
        }
        return stream
    }

    deinit {
        close()
        _ = api.terminate()
    }

    /// Blocks until `output.count` samples were captured (an input overflow is not an error: audio was lost before).
    public func read(into output: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) -> Int {
        guard capture else { throw .device("not opened for capture") }
        guard let stream else { throw .device("read after close") }
        guard let base = output.baseAddress, output.count > 0 else { return 0 }
        let result = api.readStream(stream, base, UInt(output.count))
        guard result == paNoError || result == paInputOverflowed else {
            throw .device("Pa_ReadStream: \(api.message(result)) (\(result))")
        }
        return output.count
    }

    /// Blocks until the samples are queued (an output underflow is not an error: a gap was already played).
    public func write(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        guard render else { throw .device("not opened for playback") }
        guard let stream else { throw .device("write after close") }
        guard let base = samples.baseAddress, samples.count > 0 else { return }
        let result = api.writeStream(stream, base, UInt(samples.count))
        guard result == paNoError || result == paOutputUnderflowed else {
            throw .device("Pa_WriteStream: \(api.message(result)) (\(result))")
        }
    }

    /// Stops and closes the stream; idempotent.
    public func close() {
        guard let stream else { return }
        _ = api.stopStream(stream)
        _ = api.closeStream(stream)
        self.stream = nil
    }
}
