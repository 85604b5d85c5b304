import Glibc

/// pa_sample_spec from pulse/sample.h.
private struct PaSampleSpec {
    var format: Int32
    var rate: UInt32
    var channels: UInt8
}

/// pa_buffer_attr from pulse/def.h (UInt32.max: the server's default).
private struct PaBufferAttr {
    var maxlength: UInt32
    var tlength: UInt32
    var prebuf: UInt32
    var minreq: UInt32
    var fragsize: UInt32
}

/// The first fields of pa_sink_info and pa_source_info (pulse/introspect.h), which
/// every version since 0.9 keeps in this order; later fields are not read.
private struct PaDeviceInfoHead {
    var name: UnsafePointer<CChar>?
    var index: UInt32
    var description: UnsafePointer<CChar>?
    var sampleSpec: PaSampleSpec
}

/// The first fields of pa_server_info (pulse/introspect.h).
private struct PaServerInfoHead {
    var userName: UnsafePointer<CChar>?
    var hostName: UnsafePointer<CChar>?
    var serverVersion: UnsafePointer<CChar>?
    var serverName: UnsafePointer<CChar>?
    var sampleSpec: PaSampleSpec
    var defaultSinkName: UnsafePointer<CChar>?
    var defaultSourceName: UnsafePointer<CChar>?
}

private let paSampleS16LE: Int32 = 3
private let paStreamPlayback: Int32 = 1
private let paStreamRecord: Int32 = 2
private let paContextNoAutospawn: Int32 = 1
private let paContextReady: Int32 = 4
private let paContextFailed: Int32 = 5
private let paContextTerminated: Int32 = 6
private let paOperationRunning: Int32 = 0

/// libpulse-simple and libpulse, resolved with dlopen/dlsym (PulseAudio, and
/// PipeWire's pulse server, which every current Linux desktop runs). Immutable after loading.
final class PulseAudioLibrary: @unchecked Sendable {
    typealias SimpleNew =
        @convention(c) (
            UnsafePointer<CChar>?, UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?, UnsafePointer<CChar>?,
            UnsafeRawPointer?, UnsafeRawPointer?, UnsafeRawPointer?, UnsafeMutablePointer<Int32>?
        ) -> OpaquePointer?
    typealias SimpleRead =
        @convention(c) (OpaquePointer, UnsafeMutableRawPointer, Int, UnsafeMutablePointer<Int32>?) -> Int32
    typealias SimpleWrite = @convention(c) (OpaquePointer, UnsafeRawPointer, Int, UnsafeMutablePointer<Int32>?) -> Int32
    typealias SimpleLatency = @convention(c) (OpaquePointer, UnsafeMutablePointer<Int32>?) -> UInt64
    typealias SimpleFree = @convention(c) (OpaquePointer) -> Void
    typealias StrError = @convention(c) (Int32) -> UnsafePointer<CChar>?
    typealias MainloopNew = @convention(c) () -> OpaquePointer?
    typealias MainloopGetAPI = @convention(c) (OpaquePointer) -> OpaquePointer?
    typealias MainloopIterate = @convention(c) (OpaquePointer, Int32, UnsafeMutablePointer<Int32>?) -> Int32
    typealias MainloopFree = @convention(c) (OpaquePointer) -> Void
    typealias ContextNew = @convention(c) (OpaquePointer, UnsafePointer<CChar>?) -> OpaquePointer?
    typealias ContextConnect =
        @convention(c) (OpaquePointer, UnsafePointer<CChar>?, Int32, UnsafeRawPointer?) -> Int32
    typealias ContextCall = @convention(c) (OpaquePointer) -> Void
    typealias ContextState = @convention(c) (OpaquePointer) -> Int32
    typealias ServerInfoCallback = @convention(c) (OpaquePointer?, UnsafeRawPointer?, UnsafeMutableRawPointer?) -> Void
    typealias DeviceInfoCallback =
        @convention(c) (OpaquePointer?, UnsafeRawPointer?, Int32, UnsafeMutableRawPointer?) -> Void
    typealias GetServerInfo =
        @convention(c) (OpaquePointer, ServerInfoCallback, UnsafeMutableRawPointer?) -> OpaquePointer?
    typealias GetDeviceInfoList =
        @convention(c) (OpaquePointer, DeviceInfoCallback, UnsafeMutableRawPointer?) -> OpaquePointer?
    typealias OperationState = @convention(c) (OpaquePointer) -> Int32
    typealias OperationUnref = @convention(c) (OpaquePointer) -> Void

    static let installHint = "install PulseAudio's client library (Debian/Ubuntu package libpulse0)"

    let simpleNew: SimpleNew
    let simpleRead: SimpleRead
    let simpleWrite: SimpleWrite
    let simpleLatency: SimpleLatency
    let simpleFree: SimpleFree
    let strerror: StrError
    let mainloopNew: MainloopNew
    let mainloopGetAPI: MainloopGetAPI
    let mainloopIterate: MainloopIterate
    let mainloopFree: MainloopFree
    let contextNew: ContextNew
    let contextConnect: ContextConnect
    let contextDisconnect: ContextCall
    let contextUnref: ContextCall
    let contextState: ContextState
    let getServerInfo: GetServerInfo
    let getSinkInfoList: GetDeviceInfoList
    let getSourceInfoList: GetDeviceInfoList
    let operationState: OperationState
    let operationUnref: OperationUnref

    private init(simple: UnsafeMutableRawPointer, pulse: UnsafeMutableRawPointer) throws(VoiceError) {
        func symbol<T>(_ handle: UnsafeMutableRawPointer, _ name: String, as type: T.Type) throws(VoiceError) -> T {
            guard let address = dlsym(handle, name) else {
                throw .unavailable("PulseAudio's client library has no \(name): \(PulseAudioLibrary.installHint)")
            }
            return unsafeBitCast(address, to: type)
        }
        simpleNew = try symbol(simple, "pa_simple_new", as: SimpleNew.self)
        simpleRead = try symbol(simple, "pa_simple_read", as: SimpleRead.self)
        simpleWrite = try symbol(simple, "pa_simple_write", as: SimpleWrite.self)
        simpleLatency = try symbol(simple, "pa_simple_get_latency", as: SimpleLatency.self)
        simpleFree = try symbol(simple, "pa_simple_free", as: SimpleFree.self)
        strerror = try symbol(pulse, "pa_strerror", as: StrError.self)
        mainloopNew = try symbol(pulse, "pa_mainloop_new", as: MainloopNew.self)
        mainloopGetAPI = try symbol(pulse, "pa_mainloop_get_api", as: MainloopGetAPI.self)
        mainloopIterate = try symbol(pulse, "pa_mainloop_iterate", as: MainloopIterate.self)
        mainloopFree = try symbol(pulse, "pa_mainloop_free", as: MainloopFree.self)
        contextNew = try symbol(pulse, "pa_context_new", as: ContextNew.self)
        contextConnect = try symbol(pulse, "pa_context_connect", as: ContextConnect.self)
        contextDisconnect = try symbol(pulse, "pa_context_disconnect", as: ContextCall.self)
        contextUnref = try symbol(pulse, "pa_context_unref", as: ContextCall.self)
        contextState = try symbol(pulse, "pa_context_get_state", as: ContextState.self)
        getServerInfo = try symbol(pulse, "pa_context_get_server_info", as: GetServerInfo.self)
        getSinkInfoList = try symbol(pulse, "pa_context_get_sink_info_list", as: GetDeviceInfoList.self)
        getSourceInfoList = try symbol(pulse, "pa_context_get_source_info_list", as: GetDeviceInfoList.self)
        operationState = try symbol(pulse, "pa_operation_get_state", as: OperationState.self)
        operationUnref = try symbol(pulse, "pa_operation_unref", as: OperationUnref.self)
    }

    /// dlopen's both libraries (kept loaded for the life of the process).
    static func load(simple simpleName: String = "libpulse-simple.so.0", pulse pulseName: String = "libpulse.so.0")
        throws(VoiceError) -> PulseAudioLibrary
    {
        func open(_ name: String) throws(VoiceError) -> UnsafeMutableRawPointer {
            guard let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) else {
                let reason = dlerror().map { String(cString: $0) } ?? "not found"
                throw .unavailable("PulseAudio (\(name)) cannot be loaded: \(reason); \(installHint)")
            }
            return handle
        }
        let simple = try open(simpleName)
        let pulse: UnsafeMutableRawPointer
        do { pulse = try open(pulseName) } catch {
            dlclose(simple)
            throw error
        }
        do { return try PulseAudioLibrary(simple: simple, pulse: pulse) } catch {
            dlclose(simple)
            dlclose(pulse)
            throw error
        }
    }

    func message(_ code: Int32) -> String {
        strerror(code).map { String(cString: $0) } ?? "PulseAudio error \(code)"
    }

    /// The server's sinks and sources, with its defaults marked: nil when no server
    /// answers within `timeout` seconds (none running, none this user may reach, or one
    /// that hangs). Never starts a server.
    func devices(timeout: Double = 2) -> [AudioDeviceInfo]? {
        guard let loop = mainloopNew() else { return nil }
        defer { mainloopFree(loop) }
        guard let api = mainloopGetAPI(loop), let context = contextNew(api, "tusa") else { return nil }
        defer { contextUnref(context) }
        guard contextConnect(context, nil, paContextNoAutospawn, nil) >= 0 else { return nil }
        defer { contextDisconnect(context) }
        var clock = timespec()
        clock_gettime(CLOCK_MONOTONIC, &clock)
        let deadline = Double(clock.tv_sec) + Double(clock.tv_nsec) / 1e9 + timeout
        /// One pass of the loop without blocking, then a millisecond's rest: false past the deadline.
        func step() -> Bool {
            guard mainloopIterate(loop, 0, nil) >= 0 else { return false }
            clock_gettime(CLOCK_MONOTONIC, &clock)
            guard Double(clock.tv_sec) + Double(clock.tv_nsec) / 1e9 < deadline else { return false }
            usleep(1_000)
            return true
        }
        while true {
            let state = contextState(context)
            if state == paContextReady { break }
            if state == paContextFailed || state == paContextTerminated { return nil }
            guard step() else { return nil }
        }
        let found = PulseListing()
        let box = Unmanaged.passRetained(found)
        defer { box.release() }
        func wait(_ operation: OpaquePointer?) -> Bool {
            guard let operation else { return false }
            defer { operationUnref(operation) }
            while operationState(operation) == paOperationRunning {
                guard step() else { return false }
            }
            return true
        }
        let userdata = box.toOpaque()
        guard wait(getServerInfo(context, pulseServerInfo, userdata)),
            wait(getSinkInfoList(context, pulseSinkInfo, userdata)),
            wait(getSourceInfoList(context, pulseSourceInfo, userdata))
        else { return nil }
        return found.devices.map { device in
            var device = device
            device.isDefault =
                device.direction == .playback ? device.name == found.defaultSink : device.name == found.defaultSource
            return device
        }
    }
}

/// What the introspection callbacks collect.
private final class PulseListing {
    var devices: [AudioDeviceInfo] = []
    var defaultSink: String?
    var defaultSource: String?

    func add(_ raw: UnsafeRawPointer, direction: AudioDeviceInfo.Direction) {
        let head = raw.load(as: PaDeviceInfoHead.self)
        guard let name = head.name.map({ String(cString: $0) }) else { return }
        devices.append(
            AudioDeviceInfo(
                name: name, description: head.description.map { String(cString: $0) } ?? name, direction: direction,
                sampleRate: Int(head.sampleSpec.rate), channels: Int(head.sampleSpec.channels)))
    }
}

private let pulseServerInfo: PulseAudioLibrary.ServerInfoCallback = { _, info, userdata in
    guard let info, let userdata else { return }
    let listing = Unmanaged<PulseListing>.fromOpaque(userdata).takeUnretainedValue()
    let head = info.load(as: PaServerInfoHead.self)
    listing.defaultSink = head.defaultSinkName.map { String(cString: $0) }
    listing.defaultSource = head.defaultSourceName.map { String(cString: $0) }
}

private let pulseSinkInfo: PulseAudioLibrary.DeviceInfoCallback = { _, info, eol, userdata in
    guard eol == 0, let info, let userdata else { return }
    Unmanaged<PulseListing>.fromOpaque(userdata).takeUnretainedValue().add(info, direction: .playback)
}

private let pulseSourceInfo: PulseAudioLibrary.DeviceInfoCallback = { _, info, eol, userdata in
    guard eol == 0, let info, let userdata else { return }
    Unmanaged<PulseListing>.fromOpaque(userdata).takeUnretainedValue().add(info, direction: .capture)
}

/// One blocking PulseAudio stream (pa_simple), mono 16-bit at the rate asked for: the
/// server converts from and to the device's own rate and channels. Used from one thread.
final class PulseAudioStream: DeviceStream {
    private let api: PulseAudioLibrary
    private var stream: OpaquePointer?
    let direction: AudioDeviceInfo.Direction

    /// Opens `device` (a sink or source name; nil: the server's default) with buffers of
    /// about `chunkSamples` samples, so that a read returns every chunk as it is captured
    /// and playback keeps about three chunks queued at the server. (With two, a write one
    /// wake-up late left the server short; PulseAudio then skips what arrives behind its
    /// read point, and a 44.1 kHz sink lost 5 ms of the call every 3 s.)
    init(
        _ api: PulseAudioLibrary, direction: AudioDeviceInfo.Direction, device: String?, sampleRate: Int,
        chunkSamples: Int
    ) throws(VoiceError) {
        self.api = api
        self.direction = direction
        var spec = PaSampleSpec(format: paSampleS16LE, rate: UInt32(sampleRate), channels: 1)
        let chunkBytes = UInt32(chunkSamples * 2)
        var attributes = PaBufferAttr(
            maxlength: UInt32.max, tlength: direction == .playback ? 3 * chunkBytes : UInt32.max,
            prebuf: direction == .playback ? chunkBytes : UInt32.max,
            minreq: direction == .playback ? chunkBytes : UInt32.max,
            fragsize: direction == .capture ? chunkBytes : UInt32.max)
        var error: Int32 = 0
        let opened = withUnsafePointer(to: &spec) { spec in
            withUnsafePointer(to: &attributes) { attributes in
                api.simpleNew(
                    nil, "tusa", direction == .playback ? paStreamPlayback : paStreamRecord, device,
                    direction == .playback ? "voice (playback)" : "voice (capture)", UnsafeRawPointer(spec), nil,
                    UnsafeRawPointer(attributes), &error)
            }
        }
        guard let opened else {
            let what = direction == .playback ? "playback" : "capture"
            throw .device(
                "PulseAudio cannot open the \(what) device \(device.map { "\"\($0)\"" } ?? "(default)"): \(api.message(error))")
        }
        stream = opened
    }

    deinit { close() }

    func capture(into buffer: UnsafeMutableBufferPointer<Int16>) throws(VoiceError) {
        guard let stream, let base = buffer.baseAddress, buffer.count > 0 else { return }
        var error: Int32 = 0
        guard api.simpleRead(stream, base, buffer.count * 2, &error) >= 0 else {
            throw .device("PulseAudio: \(api.message(error))")
        }
    }

    func play(_ samples: UnsafeBufferPointer<Int16>) throws(VoiceError) {
        guard let stream, let base = samples.baseAddress, samples.count > 0 else { return }
        var error: Int32 = 0
        guard api.simpleWrite(stream, base, samples.count * 2, &error) >= 0 else {
            throw .device("PulseAudio: \(api.message(error))")
        }
    }

    func close() {
        guard let stream else { return }
        api.simpleFree(stream)
        self.stream = nil
    }
}
