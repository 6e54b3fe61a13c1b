//! Machine set-up the tasks need: a GPU adapter (on Debian/Ubuntu as root, Mesa's lavapipe
//! Vulkan driver is installed when none exists; on Debian 12 from bookworm-backports, whose
//! Mesa 25 is 5–10× faster for compute than bookworm's 22.3) and the wasm32 target.

use crate::run;
use anyhow::{bail, Result};
use std::path::Path;
use std::process::Command;

const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/sluice-bookworm-backports.sources";

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether a Vulkan loader and at least one driver (ICD) are installed.
fn vulkan_present() -> bool {
    let loader = output("ldconfig", &["-p"]).is_some_and(|s| s.contains("libvulkan.so.1"));
    let icd = [
        "/usr/share/vulkan/icd.d",
        "/etc/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(d).ok())
    .flatten()
    .flatten()
    .any(|e| e.path().extension().is_some_and(|x| x == "json"));
    loader && icd
}

fn os_release(key: &str) -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim_matches('"').to_string())
}

/// Whether this process runs as root (and may install system packages).
pub fn is_root() -> bool {
    output("id", &["-u"]).as_deref() == Some("0")
}

/// Mesa's lavapipe version installed through dpkg, if any.
fn installed_mesa() -> Option<String> {
    output(
        "dpkg-query",
        &["-W", "-f=${Version}", "mesa-vulkan-drivers"],
    )
    .filter(|v| !v.is_empty())
}

fn install_lavapipe(bookworm: bool) -> Result<()> {
    let apt = [("DEBIAN_FRONTEND", "noninteractive")];
    if bookworm && !Path::new(BACKPORTS_SOURCE).exists() {
        println!("adding bookworm-backports to apt sources ({BACKPORTS_SOURCE})");
        std::fs::write(
            BACKPORTS_SOURCE,
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )?;
    }
    run("apt-get", &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq"];
    if bookworm {
        args.extend(["-t", "bookworm-backports"]);
    }
    args.push("mesa-vulkan-drivers");
    println!("$ apt-get {}", args.join(" "));
    let status = Command::new("apt-get").args(&args).envs(apt).status()?;
    if !status.success() {
        bail!("installing mesa-vulkan-drivers failed ({status})");
    }
    Ok(())
}

/// Makes sure a GPU adapter exists, installing lavapipe where that is possible.
pub fn ensure_gpu_adapter() -> Result<()> {
    if !cfg!(target_os = "linux") {
        // Metal (macOS) and DX12/Vulkan (Windows) come with the system's GPU driver.
        return Ok(());
    }
    let debian_like = Path::new("/etc/debian_version").exists();
    let bookworm = os_release("VERSION_CODENAME").as_deref() == Some("bookworm");
    let present = vulkan_present();
    let old_mesa_on_bookworm = bookworm
        && installed_mesa().is_some_and(|v| {
            v.split('.')
                .next()
                .and_then(|m| m.parse::<u32>().ok())
                .unwrap_or(0)
                < 25
        });
    if present && !(old_mesa_on_bookworm && is_root()) {
        return Ok(());
    }
    if debian_like && is_root() {
        println!(
            "{}: installing Mesa's lavapipe Vulkan driver",
            if present {
                "bookworm's Mesa 22 is slow for compute"
            } else {
                "no Vulkan driver found"
            }
        );
        install_lavapipe(bookworm)?;
        if vulkan_present() {
            return Ok(());
        }
        bail!("mesa-vulkan-drivers was installed but no Vulkan driver is visible");
    }
    bail!(
        "no GPU adapter: no Vulkan driver (ICD) was found.\n\
         Install one, then run this again:\n\
         - Debian 12:  sudo sh -c 'echo \"deb http://deb.debian.org/debian bookworm-backports main\" > /etc/apt/sources.list.d/backports.list && apt-get update && apt-get install -y -t bookworm-backports mesa-vulkan-drivers'\n\
         - Debian/Ubuntu: sudo apt-get install -y mesa-vulkan-drivers\n\
         - Fedora: sudo dnf install mesa-vulkan-drivers\n\
         - Arch: sudo pacman -S vulkan-swrast\n\
         - or your GPU vendor's Vulkan driver"
    )
}

/// Makes sure the wasm32 target is installed (the engine is checked for it).
pub fn ensure_wasm_target() -> Result<()> {
    let installed = output("rustup", &["target", "list", "--installed"]);
    match installed {
        Some(list) if list.lines().any(|l| l.trim() == "wasm32-unknown-unknown") => Ok(()),
        Some(_) => run("rustup", &["target", "add", "wasm32-unknown-unknown"]),
        None => {
            println!("rustup not found: make sure the wasm32-unknown-unknown target is installed");
            Ok(())
        }
    }
}
