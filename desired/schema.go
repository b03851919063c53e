package desired

import (
	"encoding/json"
	"fmt"
)

// SchemaID is the $id of the JSON Schema JSONSchema returns.
const SchemaID = "https://gitfleet.dev/schemas/v1alpha1/object.json"

// JSONSchema returns a JSON Schema (draft 2020-12) of one object file: kind
// must be VM, Volume or Host, and an if/then on kind checks the object
// against that kind's definition alone (so a validator reports errors of the
// object's own kind, never of the others), each with its fields, types,
// required fields and the per-object limits of this package (name pattern
// and length, integer ranges, sha256 and URL shapes, power values). Editors
// use it to complete and check object files as they are written. The
// cross-object checks (references, uniqueness, capacity) and the YAML rules
// a schema cannot express (no anchors, one document, quoting) are left to
// Load and gitfleet validate. The output is deterministic, indented JSON
// ending in a newline.
func JSONSchema() []byte {
	str := func(desc string) obj { return obj{"type": "string", "description": desc} }
	integer := func(desc string, lo, hi int) obj {
		return obj{"type": "integer", "minimum": lo, "maximum": hi, "description": desc}
	}
	ref := func(name string) obj { return obj{"$ref": "#/$defs/" + name} }
	strict := func(desc string, required []string, props obj) obj {
		o := obj{"type": "object", "additionalProperties": false, "properties": props, "description": desc}
		if len(required) > 0 {
			o["required"] = required
		}
		return o
	}
	kind := func(k Kind, spec obj) obj {
		return strict(fmt.Sprintf("A %s object of %s.", k, APIVersion),
			[]string{"apiVersion", "kind", "metadata", "spec"}, obj{
				"apiVersion": obj{"const": APIVersion},
				"kind":       obj{"const": string(k)},
				"metadata":   ref("metadata"),
				"spec":       spec,
			})
	}
	defs := obj{
		"name": obj{
			"type": "string", "minLength": 1, "maxLength": MaxNameLength,
			"pattern":     labelRE.String(),
			"description": "An RFC 1123 DNS label: lowercase letters, digits and '-', at most 63 characters.",
		},
		"sha256": obj{
			"type": "string", "pattern": sha256RE.String(),
			"description": "The file's sha256: 64 lowercase hex digits.",
		},
		"url": obj{
			"type": "string", "pattern": `^(https?://[^/?#]+|file:///)`,
			"description": "Where to fetch the file: an http, https or file:///absolute/path URL.",
		},
		"artifact": strict("A file fetched by URL and checked against its sha256.", []string{"url", "sha256"}, obj{
			"url": ref("url"), "sha256": ref("sha256"),
		}),
		"metadata": strict("The object's identity.", []string{"name"}, obj{
			"name": obj{"$ref": "#/$defs/name", "description": "Unique per kind in the fleet: the object's identity."},
			"labels": obj{
				"type": "object", "description": "Free-form labels.",
				"propertyNames":        obj{"pattern": labelKeyRE.String(), "maxLength": MaxNameLength},
				"additionalProperties": obj{"type": "string", "maxLength": 253},
			},
		}),
		"VM": kind(KindVM, obj{
			"type": "object", "additionalProperties": false,
			"required":    []string{"host", "vcpus", "memoryMB", "diskGB"},
			"anyOf":       []obj{{"required": []string{"image"}}, {"required": []string{"kernel"}}},
			"description": "The VM's desired state. It needs an image, a kernel, or both.",
			"properties": obj{
				"host":     obj{"$ref": "#/$defs/name", "description": "The Host the VM runs on."},
				"vcpus":    integer("Virtual CPUs.", 1, MaxVCPUs),
				"memoryMB": integer("Guest memory in MiB.", MinMemoryMB, MaxMemoryMB),
				"diskGB":   integer("Root disk size in GiB; may grow, never shrink.", 1, MaxDiskGB),
				"image":    obj{"$ref": "#/$defs/artifact", "description": "Bootable disk image (qcow2 or raw), cached by sha256."},
				"kernel": strict("Direct kernel boot.", []string{"url", "sha256"}, obj{
					"url": ref("url"), "sha256": ref("sha256"), "initrd": ref("artifact"),
					"cmdline": str("Kernel command line."),
				}),
				"power":   obj{"enum": []string{string(PowerRunning), string(PowerStopped)}, "default": string(PowerRunning), "description": "Desired power state."},
				"network": obj{"$ref": "#/$defs/name", "description": "A network of the VM's Host; the VM's NIC joins it instead of user-mode networking."},
				"static": strict("Fixed addresses for the NIC instead of DHCP (netplan's field names); needs network.", []string{"addresses"}, obj{
					"addresses": obj{"type": "array", "minItems": 1, "items": obj{"type": "string"},
						"description": "Addresses with prefix length, such as 192.168.1.50/24."},
					"gateway4": str("IPv4 default route's next hop; on a nat network, the network's first address by default."),
					"nameservers": strict("DNS servers and search domains.", nil, obj{
						"addresses": obj{"type": "array", "items": obj{"type": "string"}},
						"search":    obj{"type": "array", "items": obj{"type": "string"}},
					}),
				}),
				"volumes": obj{"type": "array", "items": ref("name"), "uniqueItems": true,
					"description": "Volume names on the same host, attached in order."},
				"cloudInit": strict("The NoCloud seed's content (secret: never logged).", nil, obj{
					"sshAuthorizedKeys": obj{"type": "array", "items": obj{"type": "string", "minLength": 1}},
					"userData":          str("The user-data document in any format cloud-init reads (#cloud-config, #cloud-config-archive, MIME multipart, script, ...), written to the seed byte for byte; read by cloud-init at the VM's first boot only."),
					"encryptedUserData": strict("userData encrypted with age to the VM's Host (gitfleet encrypt writes it); only that host's agent decrypts it, when it builds the seed. Not with userData.", []string{"recipient", "ciphertext"}, obj{
						"recipient":  obj{"type": "string", "pattern": "^age1", "description": "The public key it is encrypted to: the Host's spec.ageRecipient."},
						"ciphertext": obj{"type": "string", "pattern": "^\\s*-----BEGIN AGE ENCRYPTED FILE-----", "description": "The ASCII-armored age file."},
					}),
				}),
			},
		}),
		"Volume": kind(KindVolume, strict("The volume's desired state.", []string{"host", "sizeGB"}, obj{
			"host":   obj{"$ref": "#/$defs/name", "description": "The Host the volume lives on."},
			"sizeGB": integer("Size in GiB; a volume is never resized.", 1, MaxVolumeGB),
		})),
		"Host": kind(KindHost, strict("The host's desired state.", nil, obj{
			"suspend": obj{"type": "boolean", "description": "Suspend the host's reconciliation: its agent keeps the guests running as they are, writes status and acts on nothing until this is removed."},
			"suspendReason": obj{"type": "string", "maxLength": MaxSuspendReason,
				"description": "Why the host is suspended, shown in status; needs suspend: true."},
			"ageRecipient": obj{"type": "string", "pattern": "^age1", "description": "The public key of the host agent's age identity (gitfleet age-keygen prints it): VMs on this host may carry user-data encrypted to it."},
			"agentKey":     obj{"type": "string", "pattern": "^(ssh-|ecdsa-|sk-)", "description": "The public SSH key the host's agent signs its status commits with (gitfleet keygen prints it): deletes on this host are finalized only on acks signed by it."},
			"capacity": strict("What the host offers its VMs; 0 or absent means not limited.", nil, obj{
				"vcpus":    integer("Virtual CPUs for all VMs together.", 0, MaxHostVCPUs),
				"memoryMB": integer("Memory for all VMs together, in MiB.", 0, MaxHostMemoryMB),
			}),
			"networks": obj{
				"type": "object", "description": "Networks the host's VMs can join, by name.",
				"propertyNames": ref("name"),
				"additionalProperties": obj{
					"type": "object", "additionalProperties": false,
					"description": "A host network: bridge (an existing host bridge) or nat (a network the agent manages).",
					"oneOf":       []obj{{"required": []string{"bridge"}}, {"required": []string{"nat"}}},
					"properties": obj{
						"bridge": obj{"type": "string", "pattern": bridgeRE.String(), "maxLength": MaxBridgeLength,
							"description": "An existing host bridge device, such as br0; the agent adds a tap per VM."},
						"nat": strict("A network the agent manages: bridge gf-<name>, dnsmasq, masquerading.", []string{"cidr"}, obj{
							"cidr": str("Private IPv4 network, such as 10.77.0.0/24 (prefix length 16 to 29, inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10)."),
						}),
					},
				},
			},
		})),
	}
	schema := obj{
		"$schema":     "https://json-schema.org/draft/2020-12/schema",
		"$id":         SchemaID,
		"title":       "gitfleet object",
		"description": fmt.Sprintf("One object file of a gitfleet fleet (%s): a VM, a Volume or a Host.", APIVersion),
		"type":        "object",
		"required":    []string{"kind"},
		"properties": obj{
			"kind": obj{"enum": []string{string(KindVM), string(KindVolume), string(KindHost)},
				"description": "The object's kind; it chooses the rest of the schema."},
		},
		"allOf": []obj{onKind(KindVM), onKind(KindVolume), onKind(KindHost)},
		"$defs": defs,
	}
	b, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("desired: encode schema: %v", err))
	}
	return append(b, '\n')
}

// onKind applies the definition of kind k to objects whose kind is k.
func onKind(k Kind) obj {
	return obj{
		"if":   obj{"required": []string{"kind"}, "properties": obj{"kind": obj{"const": string(k)}}},
		"then": obj{"$ref": "#/$defs/" + string(k)},
	}
}

// obj is a JSON object under construction; encoding/json sorts its keys.
type obj = map[string]any
