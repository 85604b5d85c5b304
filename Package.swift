// swift-tools-version: 6.0
import PackageDescription

let strict: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "Tusa",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "STUN", targets: ["STUN"]),
        .library(name: "Transport", targets: ["Transport", "Secure"]),
        // The crypto core alone, for users (and the benchmarks) that need no NIO.
        .library(name: "Secure", targets: ["Secure"]),
        .library(name: "TusaInterop", targets: ["TusaInterop"]),
        .library(name: "Voice", targets: ["Voice"]),
        .library(name: "Rendezvous", targets: ["Rendezvous"]),
        .library(name: "ICE", targets: ["ICE"]),
        .library(name: "Call", targets: ["Call"]),
        .executable(name: "tusa", targets: ["tusa"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
    ],
    targets: [
        // System libraries (Debian -dev packages); no logic lives here.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "COpus", pkgConfig: "opus", providers: [.apt(["libopus-dev"])]),
        .systemLibrary(name: "CSpeex", pkgConfig: "speex", providers: [.apt(["libspeex-dev"])]),
        .systemLibrary(name: "CSpeexDSP", pkgConfig: "speexdsp", providers: [.apt(["libspeexdsp-dev"])]),
        .systemLibrary(name: "CPcap", pkgConfig: "libpcap", providers: [.apt(["libpcap-dev"])]),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CSndfile", pkgConfig: "sndfile", providers: [.apt(["libsndfile1-dev"])]),

        // recvmmsg/sendmmsg, UDP GSO, epoll and eventfd for the relay sockets (Glibc hides
        // the multi-message calls behind _GNU_SOURCE; epoll_event is packed).
        .target(name: "CRelayIO"),

        // STUN/TURN/ICE wire formats and sans-IO state machines.
        .target(
            name: "STUN",
            dependencies: [
                "CZlib",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
        // Sans-IO cryptographic core of the encrypted transport (libsodium): keys,
        // AEAD, BLAKE2b, the Noise framework (IK for the product), RTP media and
        // RTCP-style control packet protection with replay windows.
        .target(
            name: "Secure",
            dependencies: ["CSodium", "STUN"],
            swiftSettings: strict
        ),
        // Sans-IO rendezvous (signaling): registration by public key, lookups, payloads
        // sealed end to end between peers, TURN REST credentials for registered peers.
        .target(
            name: "Rendezvous",
            dependencies: ["Secure", "STUN"],
            swiftSettings: strict
        ),
        // Sans-IO ICE agent (RFC 8445 checks, nomination, role conflicts, peer-reflexive
        // candidates, RFC 7675 consent) on the STUN codec.
        .target(
            name: "ICE",
            dependencies: ["STUN"],
            swiftSettings: strict
        ),
        // The call layer: signaling through the rendezvous + path + secure session +
        // the voice pipeline on a real-time clock; statistics and the quality report.
        .target(
            name: "Call",
            dependencies: ["Transport", "Secure", "Voice", "Rendezvous", "STUN", "ICE"],
            swiftSettings: strict
        ),
        // SwiftNIO drivers hosting the sans-IO cores; the relay service, its
        // metrics endpoint and its config-file reader.
        .target(
            name: "Transport",
            dependencies: [
                "STUN", "Secure", "CRelayIO", "Rendezvous", "ICE",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict
        ),
        // The voice engine: codecs (Opus, Speex), the 8 kHz DSP chain (speexdsp), the
        // adaptive jitter buffer with concealment and time-stretch, mixer, audio
        // devices (WAV via libsndfile, generators, PortAudio loaded at run time), PCM taps.
        // Knows nothing about sockets.
        .target(
            name: "Voice",
            dependencies: ["COpus", "CSpeex", "CSpeexDSP", "CSndfile"],
            swiftSettings: strict
        ),
        // Capture reading (libpcap) and the interop checker behind `tusa interop`.
        .target(
            name: "TusaInterop",
            dependencies: ["STUN", "CPcap"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tusa",
            dependencies: [
                "STUN", "Transport", "TusaInterop", "Secure", "Voice", "Rendezvous", "Call",
                "CSodium", "COpus", "CSpeex", "CSpeexDSP",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the STUN decoders. Built by `make fuzz` with
        // -sanitize=fuzzer -DFUZZING; without FUZZING it replays files given as arguments.
        // The libFuzzer entry and replay mode shared by the fuzz executables.
        .target(
            name: "FuzzDriver",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "STUNFuzz",
            dependencies: ["STUN", "ICE", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the media/control packet openers and the Noise
        // responder (SecureFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "SecureFuzz",
            dependencies: ["Secure", "FuzzDriver"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "SecureTests",
            dependencies: ["Secure", "STUN"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        // The encrypted transport's costs (handshakes, flood, the NIO driver against
        // plain NIO UDP). Lives here, not in Benchmarks/, so make test's smoke run
        // reuses this package's build of SwiftNIO.
        .executableTarget(
            name: "secure-bench",
            dependencies: [
                "STUN", "Secure", "Transport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // Calls on loopback: dial to first audio and mouth-to-ear delay over a real
        // rendezvous and secure UDP, against the voice pipeline's own floor.
        .executableTarget(
            name: "call-bench",
            dependencies: [
                "Call", "Transport", "Rendezvous", "Secure", "STUN", "Voice",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // Voice benchmarks that need no timing harness: the jitter buffer's delay
        // against speexdsp's and the hindsight best, echo return loss, CPU per call-second.
        .executableTarget(
            name: "voice-bench",
            dependencies: [
                "Voice", "CSpeexDSP", "COpus", "CSpeex",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "VoiceTests",
            dependencies: ["Voice", "COpus", "CSpeex", "CSpeexDSP"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ICETests",
            dependencies: ["ICE", "STUN"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "RendezvousTests",
            dependencies: ["Rendezvous", "Secure", "STUN"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "STUNTests",
            dependencies: ["STUN"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "InteropTests",
            dependencies: [
                "STUN", "TusaInterop", "Transport", "Secure", "Rendezvous", "Call", "Voice", "ICE",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            exclude: ["peers"],
            swiftSettings: strict
        ),
    ]
)
