// swift-tools-version: 6.1
// Benchmark tools for Tusa. A separate package on purpose: building it never touches
// the main package's build directory. The load tools talk to Glibc directly; the codec
// benchmarks (Benchmarks/STUNCodec, ordo-one/benchmark) use the root package's STUN.
import PackageDescription

let strict: [SwiftSetting] = [.swiftLanguageMode(.v6)]

let package = Package(
    name: "TusaBenchmarks",
    products: [
        .executable(name: "binding-load", targets: ["binding-load"]),
        .executable(name: "udp-echo", targets: ["udp-echo"]),
        .executable(name: "turn-load", targets: ["turn-load"]),
        .executable(name: "udp-forward", targets: ["udp-forward"]),
        .executable(name: "party-load", targets: ["party-load"]),
        .executable(name: "room-forward", targets: ["room-forward"]),
        .executable(name: "udp-flood", targets: ["udp-flood"]),
        .library(name: "ClockStep", type: .dynamic, targets: ["ClockStep"]),
    ],
    dependencies: [
        // MallocInterposer only: the default RuntimeInterposer trait needs a package not available here.
        .package(url: "https://github.com/ordo-one/benchmark.git", from: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(name: "Tusa", path: ".."),
    ],
    targets: [
        // Address parsing, loopback check, clock and tiny argument helpers shared by the tools.
        // sendmmsg/recvmmsg forwarders: Glibc hides them behind _GNU_SOURCE.
        .target(name: "CMultiMsg"),
        .target(name: "BenchSupport", dependencies: ["CMultiMsg"], swiftSettings: strict),
        // STUN Binding load generator (sendmmsg/recvmmsg, N sockets, bounded window).
        .executableTarget(name: "binding-load", dependencies: ["BenchSupport", "CMultiMsg"], swiftSettings: strict),
        // Trivial reference server: answers each Binding request with a bare success header.
        .executableTarget(name: "udp-echo", dependencies: ["BenchSupport", "CMultiMsg"], swiftSettings: strict),
        // TURN load generator: allocations (401 challenge + long-term credentials) and relayed
        // ChannelData both ways, requests built with the root package's STUN module.
        .executableTarget(
            name: "turn-load",
            dependencies: [
                "BenchSupport", "CMultiMsg",
                .product(name: "STUN", package: "Tusa"), .product(name: "TusaBase", package: "Tusa"),
            ],
            swiftSettings: strict),
        // Party load generator: members with real sessions and room cores, voice-paced
        // speakers, every delivery opened hop by hop and counted (issues 15 and 17).
        .executableTarget(
            name: "party-load",
            dependencies: [
                "BenchSupport", "CMultiMsg", "BenchSodium",
                .product(name: "Party", package: "Tusa"), .product(name: "Secure", package: "Tusa"),
                .product(name: "TusaBase", package: "Tusa"),
            ],
            swiftSettings: strict),
        // Reference TURN-shaped UDP forwarder in C, the machine's limit for a relay: the same
        // syscalls and one lookup per relayed packet, none of TURN's checks.
        // The C forwarders' start: `--listen`, the stopping signals, the listener and epoll set.
        .target(name: "CForwarder"),
        // `--uring`: its relay sockets through io_uring (liburing), what a relay could gain from it.
        .executableTarget(name: "udp-forward", dependencies: ["CForwarder"], linkerSettings: [.linkedLibrary("uring")]),
        // Reference room forwarder in C, the machine's limit for parties: one read, one AEAD
        // open, then an AEAD seal and a datagram per other member, none of the party's checks.
        .executableTarget(name: "room-forward", dependencies: ["CForwarder"], linkerSettings: [.linkedLibrary("sodium")]),
        // Unauthenticated UDP at line rate in classes (STUN, Allocate, ChannelData, garbage,
        // Noise initiations with a valid mac1), answers counted per class: the soak's flood case.
        .executableTarget(name: "udp-flood", linkerSettings: [.linkedLibrary("sodium")]),
        // A wall-clock step for one process (LD_PRELOAD, offset in a file), monotonic clocks
        // and timers untouched: the soak's faults case steps the clock with it.
        .target(name: "ClockStep", linkerSettings: [.linkedLibrary("dl")]),
        // zlib for the bare-CRC baseline (the root package's CZlib is not a product).
        .systemLibrary(name: "BenchZlib", pkgConfig: "zlib"),
        // libsodium for the bare AEAD baseline (the root package's CSodium is not a product).
        .systemLibrary(name: "BenchSodium", pkgConfig: "libsodium"),
        // Media packet seal+open against the bare libsodium AEAD calls, and Noise IK
        // handshakes: `swift package benchmark --target SecureMedia`.
        .executableTarget(
            name: "SecureMedia",
            dependencies: [
                "BenchSodium",
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Secure", package: "Tusa"),
            ],
            path: "Benchmarks/SecureMedia",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // Allocations and time per voice frame through VoiceSender and VoiceReceiver:
        // `swift package benchmark --target VoiceFrame`.
        .executableTarget(
            name: "VoiceFrame",
            dependencies: [
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Voice", package: "Tusa"),
            ],
            path: "Benchmarks/VoiceFrame",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
        // STUN codec per message against the bare HMAC / CRC calls: `swift package benchmark`.
        .executableTarget(
            name: "STUNCodec",
            dependencies: [
                "BenchZlib",
                .product(name: "Benchmark", package: "benchmark"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "STUN", package: "Tusa"),
                .product(name: "TusaBase", package: "Tusa"),
            ],
            path: "Benchmarks/STUNCodec",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
