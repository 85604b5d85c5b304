// swift-tools-version: 6.0
import PackageDescription

let strict: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "Tusa",
    // Linux only: the relay's raw socket path (CRelayIO) uses recvmmsg, UDP GSO and epoll.
    products: [
        .library(name: "TusaBase", targets: ["TusaBase"]),
        .library(name: "STUN", targets: ["STUN"]),
        .library(name: "TURN", targets: ["TURN"]),
        // Client-side drivers: what an app that places calls links (no TLS server,
        // HTTP, Prometheus or raw relay sockets).
        .library(name: "Transport", targets: ["Transport", "Secure"]),
        // The server side: `tusa relay` as a library (listeners, TURN lanes, raw relay
        // IO, metrics, config file, rendezvous service).
        .library(name: "Relay", targets: ["Relay"]),
        // The directory's database side (server only).
        .library(name: "Directory", targets: ["Directory"]),
        // The crypto core alone, for users (and the benchmarks) that need no NIO.
        .library(name: "Secure", targets: ["Secure"]),
        .library(name: "TusaInterop", targets: ["TusaInterop"]),
        .library(name: "Voice", targets: ["Voice"]),
        .library(name: "Rendezvous", targets: ["Rendezvous"]),
        .library(name: "ICE", targets: ["ICE"]),
        .library(name: "CallControl", targets: ["CallControl"]),
        .library(name: "Party", targets: ["Party"]),
        .library(name: "Call", targets: ["Call"]),
        .executable(name: "tusa", targets: ["tusa"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/vapor/sqlite-nio.git", from: "1.13.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
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

        // What every sans-IO core shares: addresses, timestamps, byte helpers, token
        // buckets, the seeded generator. Depends on nothing.
        .target(name: "TusaBase", swiftSettings: strict),
        // The STUN wire: codec, integrity, FINGERPRINT, ChannelData, framing,
        // transactions, the Binding server, NAT behaviour. No sockets, no clocks.
        .target(
            name: "STUN",
            dependencies: [
                "TusaBase", "CZlib",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
        // Sans-IO RFC 8656: the TURN server and client cores, credentials, nonces,
        // peer filter, quotas.
        .target(
            name: "TURN",
            dependencies: ["TusaBase", "STUN"],
            swiftSettings: strict
        ),
        // Sans-IO cryptographic core of the encrypted transport (libsodium): keys,
        // AEAD, BLAKE2b, the Noise framework (IK for the product), RTP media and
        // RTCP-style control packet protection with replay windows.
        .target(
            name: "Secure",
            dependencies: ["CSodium", "TusaBase"],
            swiftSettings: strict
        ),
        // Sans-IO rendezvous (signaling): registration by public key, lookups, payloads
        // sealed end to end between peers, TURN REST credentials for registered peers.
        .target(
            name: "Rendezvous",
            dependencies: ["Secure", "TusaBase", "TURN"],
            swiftSettings: strict
        ),
        // Sans-IO ICE agent (RFC 8445 checks, nomination, role conflicts, peer-reflexive
        // candidates, RFC 7675 consent) on the STUN codec.
        .target(
            name: "ICE",
            dependencies: ["TusaBase", "STUN"],
            swiftSettings: strict
        ),
        // Sans-IO call decisions: the call message, hang-ups, ICE restarts (silence,
        // consent lost, address change), glare, rejoining the rendezvous, the time
        // limit. No sockets, no clocks.
        .target(
            name: "CallControl",
            dependencies: ["TusaBase", "Secure"],
            swiftSettings: strict
        ),
        // Parties, sans-IO: the relay's room rules (rosters, forwarding, speaker
        // selection, member ids bound to sessions) and a member's (joining, sender
        // keys sealed end to end in SFrame-style frames, rekeys on joins and leaves).
        .target(
            name: "Party",
            dependencies: ["TusaBase", "Secure", "Rendezvous"],
            swiftSettings: strict
        ),
        // The call layer: signaling through the rendezvous + path + secure session +
        // the voice pipeline on a real-time clock, hosting the CallController;
        // statistics and the quality report.
        .target(
            name: "Call",
            dependencies: [
                "CallControl", "Transport", "Secure", "Voice", "Rendezvous", "TusaBase", "STUN", "TURN", "ICE", "Party",
            ],
            swiftSettings: strict
        ),
        // Client-side SwiftNIO drivers hosting the sans-IO cores: the secure UDP
        // endpoint, the ICE endpoint, the TURN client connection, the STUN client
        // (with RFC 5780 discovery), the rendezvous client.
        .target(
            name: "Transport",
            dependencies: [
                "TusaBase", "STUN", "TURN", "Secure", "Rendezvous", "ICE", "Party",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // The relay (server side): listeners (UDP, TCP, TLS), TURN lanes, raw relay
        // IO (CRelayIO), metrics and their endpoint, the config file, the
        // rendezvous service. Protocol rules live in the cores, not here.
        .target(
            name: "Relay",
            dependencies: [
                "TusaBase", "STUN", "TURN", "Rendezvous", "Transport", "Party", "Secure", "CRelayIO",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: strict
        ),
        // The directory (server side): what the rendezvous keeps across restarts,
        // in a database (SQLite through sqlite-nio, PostgreSQL through postgres-nio),
        // behind `tusa directory`.
        .target(
            name: "Directory",
            dependencies: [
                "Relay", "Rendezvous", "Secure",
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // The voice engine: codecs (Opus, Speex), the 8 kHz DSP chain (speexdsp), the
        // adaptive jitter buffer with concealment and time-stretch, mixer, audio
        // devices (WAV via libsndfile, generators, PortAudio loaded at run time), PCM taps.
        // Knows nothing about sockets.
        .target(
            name: "Voice",
            dependencies: ["TusaBase", "COpus", "CSpeex", "CSpeexDSP", "CSndfile"],
            swiftSettings: strict
        ),
        // Capture reading (libpcap) and the interop checker behind `tusa interop`.
        .target(
            name: "TusaInterop",
            dependencies: ["TusaBase", "STUN", "TURN", "CPcap"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "tusa",
            dependencies: [
                "TusaBase", "STUN", "TURN", "Transport", "Relay", "TusaInterop", "Secure", "Voice", "Rendezvous", "Call", "Party",
                "Directory", "CSodium", "COpus", "CSpeex", "CSpeexDSP",
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
            dependencies: ["STUN", "TURN", "ICE", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the media/control packet openers and the Noise
        // responder (SecureFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "SecureFuzz",
            dependencies: ["Secure", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the directory's parsers and server core
        // (RendezvousFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "RendezvousFuzz",
            dependencies: ["Rendezvous", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the party wire formats and room cores
        // (PartyFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "PartyFuzz",
            dependencies: ["Party", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for a call's signalling: call messages and the call
        // controller under a script of them (CallFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "CallFuzz",
            dependencies: ["CallControl", "FuzzDriver"],
            swiftSettings: strict
        ),
        // libFuzzer entry point for the voice receive path: redundant audio, the jitter
        // buffers and the decoders (VoiceFuzzChecks); same build modes as STUNFuzz.
        .executableTarget(
            name: "VoiceFuzz",
            dependencies: ["Voice", "FuzzDriver"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "SecureTests",
            dependencies: ["Secure", "TusaBase", "TestSupport"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        // Benchmarks that run inside this package's build (make test's smoke run reuses
        // its SwiftNIO): their sources live with every other benchmark under
        // Benchmarks/ (Benchmarks/bench.sh is the one entry point, `make bench`).
        // The encrypted transport's costs (handshakes, flood, the NIO driver against
        // plain NIO UDP).
        .executableTarget(
            name: "secure-bench",
            dependencies: [
                "TusaBase", "STUN", "Secure", "Transport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            path: "Benchmarks/InProcess/secure-bench",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "party-bench",
            dependencies: [
                "TusaBase", "STUN", "Secure", "Transport", "Party", "Relay",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Benchmarks/InProcess/party-bench",
            swiftSettings: strict
        ),
        // Invitations acknowledged once stored, the directory's stores side by side:
        // in memory, SQLite and PostgreSQL.
        .executableTarget(
            name: "directory-bench",
            dependencies: [
                "Directory", "Relay", "Rendezvous", "Secure", "Transport", "TusaBase", "TestSupport",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Benchmarks/InProcess/directory-bench",
            swiftSettings: strict
        ),
        // Many party users against a running directory and its relays (`directory-load`);
        // issue 16's cluster test plays the same users (DirectoryLoad).
        .target(
            name: "DirectoryLoad",
            dependencies: [
                "Party", "Rendezvous", "Secure", "Transport", "TusaBase",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            path: "Benchmarks/InProcess/DirectoryLoad",
            swiftSettings: strict
        ),
        .executableTarget(
            name: "directory-load",
            dependencies: [
                "DirectoryLoad", "Rendezvous", "Secure", "TusaBase",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Benchmarks/InProcess/directory-load",
            swiftSettings: strict
        ),
        // Calls on loopback: dial to first audio and mouth-to-ear delay over a real
        // rendezvous and secure UDP, against the voice pipeline's own floor; and a
        // party's mouth-to-ear through the relay beside the call's.
        .executableTarget(
            name: "call-bench",
            dependencies: [
                "Call", "Transport", "Relay", "Rendezvous", "Secure", "TusaBase", "STUN", "Voice", "Party",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Benchmarks/InProcess/call-bench",
            swiftSettings: strict
        ),
        // Voice benchmarks that need no timing harness: the jitter buffer's delay
        // against speexdsp's and the hindsight best, echo return loss, CPU per call-second.
        .executableTarget(
            name: "voice-bench",
            dependencies: [
                "Voice", "TusaBase", "CSpeexDSP", "COpus", "CSpeex",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            path: "Benchmarks/InProcess/voice-bench",
            swiftSettings: strict
        ),
        .testTarget(
            name: "VoiceTests",
            dependencies: ["Voice", "TusaBase", "COpus", "CSpeex", "CSpeexDSP", "TestSupport"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "ICETests",
            dependencies: ["ICE", "TusaBase", "STUN", "TestSupport"],
            swiftSettings: strict
        ),
        // The call controller on a virtual clock: hang-ups, restarts, glare, rejoins.
        .testTarget(
            name: "CallControlTests",
            dependencies: ["CallControl", "Secure", "TusaBase", "TestSupport"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        // Rooms on a virtual clock: joins, leaves, kicks, rekeys racing, speakers, spoofing.
        .testTarget(
            name: "PartyTests",
            dependencies: ["Party", "Secure", "Rendezvous", "TusaBase", "TestSupport"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "DirectoryTests",
            dependencies: [
                "Directory", "Rendezvous", "Secure", "Relay", "TestSupport",
                .product(name: "SQLiteNIO", package: "sqlite-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "RendezvousTests",
            dependencies: ["Rendezvous", "Secure", "TusaBase", "TestSupport"],
            exclude: ["FuzzCrashes", "FuzzSeeds"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "STUNTests",
            dependencies: ["STUN", "TusaBase", "TestSupport"],
            exclude: ["FuzzCrashes"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TURNTests",
            dependencies: ["TURN", "STUN", "TusaBase", "TestSupport"],
            swiftSettings: strict
        ),
        // The relay's pure parts and its handlers on EmbeddedChannel or loopback sockets.
        .testTarget(
            name: "RelayTests",
            dependencies: [
                "Relay", "Transport", "TURN", "STUN", "TusaBase", "Party", "Secure", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TransportTests",
            dependencies: [
                "Transport", "Secure", "TusaBase", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "TusaBaseTests",
            dependencies: ["TusaBase"],
            swiftSettings: strict
        ),
        // Capture-side pieces without real peers (the rtpdump writer).
        .testTarget(
            name: "TusaInteropTests",
            dependencies: ["TusaInterop", "TusaBase"],
            swiftSettings: strict
        ),
        // Shared by the test targets: the shared corpus beside the project.
        .target(
            name: "TestSupport",
            dependencies: ["TusaBase"],
            path: "Tests/TestSupport",
            swiftSettings: strict
        ),
        .testTarget(
            name: "InteropTests",
            dependencies: [
                "TusaBase", "STUN", "TURN", "TusaInterop", "Transport", "Relay", "Secure", "Rendezvous", "Call", "Voice", "ICE",
                "Party", "TestSupport", "DirectoryLoad",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
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
