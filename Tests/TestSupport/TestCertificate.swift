import Foundation

/// A self-signed certificate and its key for TLS tests, made with openssl
/// (scripts/setup.sh installs it) in a fresh temporary folder.
public struct TestCertificate: Sendable {
    /// PEM certificate (CN=localhost, two days).
    public let certificateFile: String
    /// PEM private key (RSA 2048, unencrypted).
    public let privateKeyFile: String

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Makes one; throws, naming the reason, when openssl is missing or fails.
    public static func make() throws -> TestCertificate {
        let openssl = ["/usr/bin/openssl", "/usr/local/bin/openssl"].first { FileManager.default.isExecutableFile(atPath: $0) }
        guard let openssl else { throw Failure(description: "openssl is not installed (scripts/setup.sh installs it)") }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tusa-tls-\(UUID())").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: openssl)
        process.arguments = [
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "\(dir)/key.pem",
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
