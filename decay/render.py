def render() -> str:
    return "# decay\n"
