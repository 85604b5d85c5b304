import Foundation

/// A self-signed certificate and its key for TLS tests, made with openssl
/// (scripts/setup.sh installs it) in a fresh temporary folder.
public struct TestCertificate: Sendable {
    /// PEM certificate (CN=localhost, two days).
    public let certificateFile: String
    /// PEM private key (RSA 2048 unless asked otherwise, unencrypted).
    public let privateKeyFile: String

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Makes one with a key of `key` (openssl's `-newkey` words: `rsa:2048`, or `ec`
    /// with `-pkeyopt ec_paramgen_curve:P-256`, or `ed25519`); throws, naming the reason,
    /// when openssl is missing or fails.
    public static func make(key: [String] = ["rsa:2048"]) throws -> TestCertificate {
        let openssl = ["/usr/bin/openssl", "/usr/local/bin/openssl"].first { FileManager.default.isExecutableFile(atPath: $0) }
        guard let openssl else { throw Failure(description: "openssl is not installed (scripts/setup.sh installs it)") }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-tls-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: openssl)
        process.arguments =
            [
                "req", "-x509", "-newkey",
            ] + key + [
                "-nodes", "-keyout", "\(dir)/key.pem",
                "-out", "\(dir)/cert.pem", "-days", "2", "-subj", "/CN=localhost",
            ]
        let errors = Pipe()
        process.standardOutput = FileHandle.nullDevice
        process.standardError = errors
        try process.run()
        let said = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw Failure(
                description: "openssl req failed (\(process.terminationStatus)): \(String(decoding: said, as: UTF8.self))")
        }
        return TestCertificate(certificateFile: "\(dir)/cert.pem", privateKeyFile: "\(dir)/key.pem")
    }
}
