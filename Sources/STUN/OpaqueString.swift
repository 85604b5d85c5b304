import Foundation

/// The OpaqueString profile of the PRECIS framework (RFC 8265 §4.2), which
/// RFC 8489 applies to passwords and realms before they enter a key.
public enum OpaqueString {
    /// Prepares a string: non-ASCII spaces become U+0020, then NFC; control
    /// characters, non-characters and the empty string are refused.
    public static func prepare(_ s: String) throws(STUNError) -> String {
        var scalars = String.UnicodeScalarView()
        for u in s.unicodeScalars {
            let v = u.value
            if u.properties.generalCategory == .spaceSeparator {
                scalars.append(" ")
            } else if v < 0x20 || (0x7F...0x9F).contains(v) {
                throw STUNError(.badCredentials, "control character U+\(String(v, radix: 16, uppercase: true)) is not allowed")
            } else if u.properties.isNoncharacterCodePoint {
                throw STUNError(.badCredentials, "non-character U+\(String(v, radix: 16, uppercase: true)) is not allowed")
            } else {
                scalars.append(u)
            }
        }
        let prepared = String(scalars).precomposedStringWithCanonicalMapping
        guard !prepared.isEmpty else { throw STUNError(.badCredentials, "empty string") }
        return prepared
    }
}
